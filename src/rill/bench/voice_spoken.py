"""`rill bench voice`'s spoken half (issue 51): end of the user's speech to the first byte of the spoken
answer, over /v1/realtime with `output_modalities: ["audio"]` and the server's voice (espeak-ng, the default,
and a random-weight Kokoro-82M: `--voices`, each on a server of its own), at 1 and 8 concurrent sessions; against the cascade a user would build from rill's own endpoints: the whole
recording to /v1/audio/transcriptions, its text to /v1/chat/completions (the whole answer), then the answer
to /v1/audio/speech (streamed PCM), timed from the same moment to the first audio byte.

A session speaks its question as a microphone would (rill.bench.voice.speak), then silence; server VAD ends
the turn and answers. The end of speech is the question's last sound (rill.bench.voice.sound_end_s), so the
figure includes the VAD's silence (500 ms by default), as a person waiting for the answer hears it.
Targets (issue 51): p50 at most 300 ms with one session, at most 1/5 of the cascade. Reported, never asserted.
"""

from __future__ import annotations

import json
import time

import numpy as np

from rill.bench.common import percentile
from rill.bench.speech_set import Clip

SPEECH_MODEL = "tts-1"  # OpenAI's name: /v1/audio/speech serves the server's voice under it
TURN_TIMEOUT_S = 120  # a spoken answer of --max-tokens words that has not ended by then is counted unfinished


async def spoken_turn(url: str, clip: Clip, args, manual: bool = False) -> tuple[float, str]:
    """One question, answered aloud: seconds from the end of speech to the first audio delta (nan: none),
    and how the turn ended: "done" (response.done), "timeout" (not done within TURN_TIMEOUT_S: the socket
    is closed, so the server cancels it), "error" (an error event) or "closed" (the server closed the socket).
    `manual`: push-to-talk (the audio up to its last sound, then commit and response.create; no VAD silence)."""
    import trio
    from trio_websocket import ConnectionClosed

    from rill.bench.voice import LEAD_S, RATE, realtime_session, sound_end_s, speak, vad

    settings = {"temperature": 0, "max_output_tokens": args.max_tokens, "output_modalities": ["audio"],
                "turn_detection": None if manual else vad(args.silence_ms)}
    # "closed" unless read() says otherwise: trio-websocket ends the block when the server closes the socket
    first, ended, speech_end = float("nan"), "closed", float("nan")
    try:
        async with realtime_session(url, settings) as ws, trio.open_nursery() as nursery:
            async def read() -> None:
                nonlocal first, ended
                with trio.move_on_after(TURN_TIMEOUT_S) as deadline:
                    while True:
                        event = json.loads(await ws.get_message())
                        if event["type"] == "response.output_audio.delta" and first != first:
                            first = trio.current_time()
                        if event["type"] in ("response.done", "error"):
                            ended = "done" if event["type"] == "response.done" else "error"
                            break
                if deadline.cancelled_caught:
                    ended = "timeout"
                nursery.cancel_scope.cancel()

            nursery.start_soon(read)
            said = clip.audio[:int(round(sound_end_s(clip.audio) * RATE))] if manual else clip.audio
            start = await speak(ws, np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), said]))
            speech_end = start + LEAD_S + sound_end_s(clip.audio)
            if manual:
                await ws.send_message(json.dumps({"type": "input_audio_buffer.commit"}))
                await ws.send_message(json.dumps({"type": "response.create"}))
            else:
                await speak(ws, np.zeros(int((args.silence_ms / 1000 + 3.0) * RATE), np.float32))
    except ConnectionClosed:
        ended = "closed"
    return first - speech_end, ended


async def cascade_turn(base: str, clip: Clip, args) -> float:
    """Transcribe, chat, speak: seconds from the end of the recording to the first audio byte."""
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        t0 = time.perf_counter()
        files = {"file": ("q.wav", clip.path.read_bytes(), "audio/wav")}
        text = (await client.post("/v1/audio/transcriptions", files=files, data={"model": args.speech_model})).json()["text"]
        body = {"model": args.llm, "messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens,
                "temperature": 0}
        answer = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
        speech = {"model": SPEECH_MODEL, "input": answer or ".", "voice": "alloy", "response_format": "pcm"}
        async with client.stream("POST", "/v1/audio/speech", json=speech) as response:
            async for chunk in response.aiter_bytes():
                if chunk:
                    return time.perf_counter() - t0
    return float("nan")


async def spoken_sessions(url: str, clips: list[Clip], n: int, args) -> dict:
    """n sessions at once, each asking its share of the questions (at least two) one after another."""
    import trio

    turns: list[tuple[float, str]] = []
    asked = 0

    async def one(i: int) -> None:
        nonlocal asked
        for j in range(max(2, len(clips) // n)):
            asked += 1
            turns.append(await spoken_turn(url, clips[(i + j * n) % len(clips)], args))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    assert len(turns) == asked, (len(turns), asked)  # every question asked is counted, answered or not
    return {"sessions": n, **_turns(turns)}


async def measure(base: str, url: str, clips: list[Clip], args) -> dict:
    out = {"sessions": [], "cascade": []}
    out["manual_commit"] = _turns([await spoken_turn(url, clip, args, manual=True) for clip in clips])
    for n in [int(s) for s in args.spoken_sessions.split(",") if s]:
        out["sessions"].append(await spoken_sessions(url, clips, n, args))
    out["cascade"] = _ms([await cascade_turn(base, clip, args) for clip in clips])
    return out


def summary_lines(spoken: dict, voice: str) -> list[str]:
    fmt = lambda v: "n/a" if v is None else f"{v:.0f} ms"  # noqa: E731
    cascade = spoken["cascade"].get("p50")
    manual = spoken["manual_commit"].get("p50")
    lines = [f"  {voice}: end of speech -> first byte of the spoken answer: cascade (transcribe, chat, /v1/audio/speech) p50 "
             f"{fmt(cascade)}; manual commit p50 {fmt(manual)}"
             + (f", {manual / cascade:.2f} of the cascade (target <= 0.2, p50 <= 300 ms)" if manual and cascade else "")]
    for s in spoken["sessions"]:
        ratio = f", {s['p50'] / cascade:.2f} of the cascade" if s.get("p50") and cascade else ""
        unfinished = (f", {s['unfinished']} unfinished ({s.get('timeout', 0)} past {TURN_TIMEOUT_S} s, {s.get('error', 0)} "
                      f"errors, {s.get('closed', 0)} closed by the server)" if s.get("unfinished") else "")
        lines.append(f"    server VAD (its silence included), {s['sessions']} sessions: p50 {fmt(s.get('p50'))}, p95 "
                     f"{fmt(s.get('p95'))} over {s['n']} answers{ratio}{unfinished}")
    return lines


def _turns(turns: list[tuple[float, str]]) -> dict:
    """_ms of the turns' first audio, and how many answers did not end with response.done (and why)."""
    out = {**_ms([seconds for seconds, _ in turns]), "unfinished": sum(ended != "done" for _, ended in turns)}
    for how in ("timeout", "error", "closed"):
        out[how] = sum(ended == how for _, ended in turns)
    return out


def _ms(seconds: list[float]) -> dict:
    ms = [1000 * s for s in seconds if s == s]
    out = {"n": len(ms), "missing": len(seconds) - len(ms)}
    if ms:
        out.update(p50=percentile(ms, 50), p95=percentile(ms, 95))
    return out
