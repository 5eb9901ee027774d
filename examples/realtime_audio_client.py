"""Stream audio into rill's realtime WebSocket API as `input_audio_buffer.append` events (PCM16
mono, base64, 16 or 24 kHz) and print transcription deltas, vLLM-style: a first commit starts
transcription, `commit` with `final: true` ends the audio.

A model with an audio front end is needed to hear it; rill's current models have none, and the
server says so with an `audio_not_supported` error event, which this client prints.

    python examples/realtime_audio_client.py speech.wav
    python examples/realtime_audio_client.py --mic --seconds 5      # needs: pip install sounddevice
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import wave

import trio
from trio_websocket import open_websocket_url

CHUNK_S = 0.1  # audio per append: 100 ms


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wav", nargs="?", help="a PCM16 mono WAV file at 16 or 24 kHz")
    p.add_argument("--mic", action="store_true", help="record from the microphone instead (sounddevice)")
    p.add_argument("--seconds", type=float, default=5.0, help="how long to record with --mic")
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    p.add_argument("--api-key", default=os.environ.get("RILL_API_KEY"))
    p.add_argument("--realtime", action="store_true", help="pace the file at its real speed")
    return p.parse_args()


def read_wav(path: str) -> tuple[bytes, int]:
    with wave.open(path, "rb") as f:
        if f.getnchannels() != 1 or f.getsampwidth() != 2 or f.getframerate() not in (16_000, 24_000):
            sys.exit(f"{path}: need PCM16 mono at 16 or 24 kHz (got {f.getnchannels()} channels, "
                     f"{8 * f.getsampwidth()} bits, {f.getframerate()} Hz); convert it with sox or ffmpeg")
        return f.readframes(f.getnframes()), f.getframerate()


def record(seconds: float, rate_hz: int = 16_000) -> tuple[bytes, int]:
    try:
        import sounddevice
    except ImportError:
        sys.exit("--mic needs the sounddevice package: pip install sounddevice")
    print(f"recording {seconds:g} s...", file=sys.stderr)
    audio = sounddevice.rec(int(seconds * rate_hz), samplerate=rate_hz, channels=1, dtype="int16")
    sounddevice.wait()
    return audio.tobytes(), rate_hz


async def send(ws, type_: str, **fields) -> None:
    await ws.send_message(json.dumps({"type": type_, **fields}))


async def stream_audio(ws, pcm: bytes, rate_hz: int, paced: bool) -> None:
    step = int(CHUNK_S * rate_hz) * 2
    await send(ws, "input_audio_buffer.commit")  # vLLM: start transcribing
    for start in range(0, len(pcm), step):
        await send(ws, "input_audio_buffer.append", audio=base64.b64encode(pcm[start:start + step]).decode())
        await trio.sleep(CHUNK_S if paced else 0)
    await send(ws, "input_audio_buffer.commit", final=True)


async def print_events(ws) -> None:
    while True:
        event = json.loads(await ws.get_message())
        if event["type"] == "transcription.delta":
            print(event["delta"], end="", flush=True)
        elif event["type"] == "transcription.done":
            print(f"\n[done: {event['text']!r}]", file=sys.stderr)
            return
        elif event["type"] == "error":
            print(f"[error {event['error']['code']}] {event['error']['message']}", file=sys.stderr)
            if event["error"]["code"] == "audio_not_supported":
                return


async def main() -> None:
    args = parse_args()
    if not args.mic and not args.wav:
        sys.exit("give a WAV file or --mic")
    pcm, rate_hz = record(args.seconds) if args.mic else read_wav(args.wav)
    headers = [(b"authorization", f"Bearer {args.api_key}".encode())] if args.api_key else []
    async with open_websocket_url(args.url, extra_headers=headers) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await send(ws, "session.update", session={"input_audio_format": {"type": "audio/pcm", "rate": rate_hz}})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_audio, ws, pcm, rate_hz, args.realtime)
            await print_events(ws)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
