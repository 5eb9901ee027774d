"""Mode B with speech: a WAV sent as audio chunks at real-time pace into a rill streaming session,
which transcribes them as they arrive and prefills the words; the transcript is shown as it is
recognised (the session's status carries it), and the answer streams after the end of input.

    espeak-ng -w question.wav "What is twelve plus thirty?"
    python examples/voice_session.py question.wav
    python examples/voice_session.py question.wav --url http://127.0.0.1:8000 --chunk-ms 200

The server needs a speech model (`rill serve` serves rill-tiny-speech by default).
"""

from __future__ import annotations

import argparse
import base64
import json
import time

import httpx
import numpy as np
import trio

SESSIONS = "/v1/streaming_input/sessions"
RATE_HZ = 16_000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wav", help="an audio file (WAV, FLAC, OGG)")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--chunk-ms", type=int, default=100, help="audio per chunk")
    p.add_argument("--max-tokens", type=int, default=64)
    return p.parse_args()


def read_audio(path: str) -> np.ndarray:
    import soundfile
    import soxr

    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    return soxr.resample(samples.mean(axis=1), rate, RATE_HZ).astype(np.float32)


def b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def send_audio(client: httpx.AsyncClient, session: str, audio: np.ndarray, chunk_s: float) -> float:
    """Chunks at the audio's own pace, then finish; returns when the audio ended."""
    step = int(chunk_s * RATE_HZ)
    for seq, start in enumerate(range(0, len(audio), step)):
        chunk = {"sequence_id": seq, "modality": "audio", "payload": b64(audio[start:start + step]),
                 "sample_rate": RATE_HZ}
        while (response := await client.post(f"{session}/chunks", json=chunk)).status_code == 429:
            await trio.sleep(chunk_s)  # rate_limited: the recogniser is behind; try again
        response.raise_for_status()
        await trio.sleep(chunk_s)
    ended = time.monotonic()
    (await client.post(f"{session}/finish")).raise_for_status()
    return ended


async def show_transcript(client: httpx.AsyncClient, session: str, done: trio.Event, shown_all: trio.Event) -> None:
    """Poll the session's transcript; after `done`, one last look, then `shown_all`."""
    shown = ""
    while True:
        last = done.is_set()
        transcript = (await client.get(session)).json().get("transcript") or ""
        if transcript.startswith(shown) and len(transcript) > len(shown):
            print(transcript[len(shown):], end="", flush=True)
            shown = transcript
        if last:
            shown_all.set()
            return
        with trio.move_on_after(0.1):
            await done.wait()


async def main() -> None:
    args = parse_args()
    audio = read_audio(args.wav)
    async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
        body = {"messages": [], "max_tokens": args.max_tokens, "temperature": 0, "stream": True}
        created = await client.post(SESSIONS, json=body)
        created.raise_for_status()
        session = f"{SESSIONS}/{created.json()['session_id']}"
        print("you: ", end="", flush=True)
        first_token_s = None
        async with trio.open_nursery() as nursery:
            done, shown_all = trio.Event(), trio.Event()
            nursery.start_soon(show_transcript, client, session, done, shown_all)
            ended = await send_audio(client, session, audio, args.chunk_ms / 1000)
            async with client.stream("GET", f"{session}/events") as events:
                async for line in events.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if delta:
                        if first_token_s is None:
                            first_token_s = time.monotonic()
                            done.set()
                            await shown_all.wait()
                            print("\nrill: ", end="")
                        print(delta, end="", flush=True)
            done.set()
        if first_token_s is not None:
            print(f"\n[first token {1e3 * (first_token_s - ended):.0f} ms after the audio ended]")


if __name__ == "__main__":
    trio.run(main)
