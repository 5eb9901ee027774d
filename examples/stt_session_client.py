"""Mode B: a speech-to-text pipeline feeding its transcript deltas into a rill streaming session at
speaking pace (about 150 words a minute), then printing the answer as it streams. rill prefills
the transcript while it is being spoken, so the answer starts about one engine step after the
speaker stops.

    rill serve &
    python examples/stt_session_client.py
    python examples/stt_session_client.py --transcript "Uppercase: the quick brown fox" --words-per-minute 300
"""

import argparse
import json
import time

import httpx
import trio

SESSIONS = "/v1/streaming_input/sessions"


async def speak(client: httpx.AsyncClient, session: str, transcript: str, seconds_per_word: float) -> float:
    """Send the transcript word by word, as an STT engine emits deltas; returns when speech ended."""
    words = transcript.split(" ")
    for i, word in enumerate(words):
        if i:
            await trio.sleep(seconds_per_word)  # the speaker's pace
        delta = word if i == 0 else " " + word
        response = await client.post(f"{session}/chunks", json={"sequence_id": i, "payload": delta})
        response.raise_for_status()
        print(f"[heard {delta!r}: prefill started={response.json()['started']}]")
    ended = time.perf_counter()
    (await client.post(f"{session}/finish")).raise_for_status()
    return ended


async def listen(client: httpx.AsyncClient, session: str, times: dict) -> None:
    """The session's events, opened before the speaker is done: the answer as it streams."""
    async with client.stream("GET", f"{session}/events") as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                print(f"\n[error: {chunk['error']['message']}]")
                return
            text = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if text:
                times.setdefault("first", time.perf_counter())
                print(text, end="", flush=True)
    print()


async def main(args) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=None) as client:
        request = {"messages": [{"role": "system", "content": "You answer spoken questions briefly."}],
                   "max_tokens": args.max_tokens, "temperature": 0}
        created = (await client.post(SESSIONS, json=request)).raise_for_status().json()
        session = f"{SESSIONS}/{created['session_id']}"
        print(f"[session {created['session_id']}, expires after {created['expires_in']:.0f} s idle]")
        times: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen, client, session, times)
            times["spoken"] = await speak(client, session, args.transcript, 60 / args.words_per_minute)
        if "first" in times:
            print(f"[first token {1000 * (times['first'] - times['spoken']):.0f} ms after the speaker stopped]")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--transcript", default="What is 17 + 25?")
    p.add_argument("--words-per-minute", type=float, default=150.0)
    p.add_argument("--max-tokens", type=int, default=64)
    trio.run(main, p.parse_args())
