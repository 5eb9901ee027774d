"""Talk to rill over its realtime WebSocket API: audio goes up as `input_audio_buffer.append` events
(PCM16 mono, base64) at real-time pace, the transcript comes back as it is recognised, and the
answer streams once the server's VAD hears the end of the turn.

    espeak-ng -w question.wav "What is twelve plus thirty?"
    python examples/realtime_audio_client.py question.wav
    python examples/realtime_audio_client.py question.wav --manual          # commit, then response.create
    python examples/realtime_audio_client.py question.wav --transcribe-only # a transcription session
    python examples/realtime_audio_client.py --mic                          # pip install sounddevice; Ctrl+C ends
    python examples/realtime_audio_client.py question.wav --speak answer.wav  # the answer spoken, saved

A WAV in any rate or channel count is read with soundfile and resampled to 16 kHz with soxr (both
come with rill). The server needs a speech model (`rill serve` serves rill-tiny-speech by default).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time

import numpy as np
import trio
from trio_websocket import open_websocket_url

RATE_HZ = 16_000
CHUNK_S = 0.1  # audio per append: 100 ms
TAIL_SILENCE_S = 1.0  # after a file, so that server VAD hears the turn end


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wav", nargs="?", help="an audio file (WAV, FLAC, OGG), sent at its real pace")
    p.add_argument("--mic", action="store_true", help="stream the microphone instead (sounddevice)")
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    p.add_argument("--api-key", default=os.environ.get("RILL_API_KEY"))
    p.add_argument("--manual", action="store_true", help="no server VAD: commit at the end, then response.create")
    p.add_argument("--transcribe-only", action="store_true", help="a transcription session: no answer")
    p.add_argument("--silence-ms", type=int, default=500, help="server VAD's silence_duration_ms")
    p.add_argument("--fast", action="store_true", help="send the file as fast as possible, not at real pace")
    p.add_argument("--speak", metavar="OUT.wav", help="ask for spoken answers (output_modalities [\"audio\"]) and "
                   "write the last one's audio (PCM16, 24 kHz) to this WAV file")
    return p.parse_args()


def read_audio(path: str) -> np.ndarray:
    import soundfile
    import soxr

    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    return soxr.resample(samples.mean(axis=1), rate, RATE_HZ).astype(np.float32)


def b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def send(ws, type_: str, **fields) -> None:
    await ws.send_message(json.dumps({"type": type_, **fields}))


class Printer:
    """What the server says, as it says it; `speech_end_s` is set when the last audio went up."""

    def __init__(self, answer: bool, speak_to: str | None = None):
        self.answer = answer
        self.speak_to, self.audio = speak_to, bytearray()  # a spoken answer's PCM16 at 24 kHz
        self.speech_end_s: float | None = None
        self.first_token_s: float | None = None

    async def run(self, ws) -> None:
        while True:
            event = json.loads(await ws.get_message())
            kind = event["type"]
            if kind == "input_audio_buffer.speech_started":
                print("\n[speech started]", file=sys.stderr)
            elif kind == "conversation.item.input_audio_transcription.delta":
                print(event["delta"], end="", flush=True)
            elif kind == "conversation.item.input_audio_transcription.completed":
                print(f"\n[heard: {event['transcript']!r}]", file=sys.stderr)
                if not self.answer:
                    return
            elif kind == "response.output_audio.delta":
                self.audio += base64.b64decode(event["delta"])
            elif kind in ("response.output_text.delta", "response.output_audio_transcript.delta"):
                if self.first_token_s is None:
                    self.first_token_s = time.monotonic()
                    print("rill: ", end="")
                print(event["delta"], end="", flush=True)
            elif kind == "response.done":
                self._done(event["response"])
                if self.speech_end_s is not None:
                    return
            elif kind == "error":
                print(f"\n[error {event['error']['code']}] {event['error']['message']}", file=sys.stderr)

    def _done(self, response: dict) -> None:
        usage = response.get("usage") or {}
        line = f"\n[{response['status']}: {usage.get('input_tokens')} tokens in, {usage.get('output_tokens')} out"
        if self.first_token_s is not None and self.speech_end_s is not None:
            line += f"; first token {1e3 * (self.first_token_s - self.speech_end_s):.0f} ms after the audio ended"
        print(line + "]", file=sys.stderr)
        self.first_token_s = None
        if self.speak_to and self.audio:
            import soundfile

            soundfile.write(self.speak_to, np.frombuffer(bytes(self.audio), dtype="<i2"), 24_000)
            print(f"[spoken answer: {len(self.audio) / 48_000:.1f} s -> {self.speak_to}]", file=sys.stderr)
            self.audio.clear()


async def send_file(ws, audio: np.ndarray, args, printer: Printer) -> None:
    step = int(CHUNK_S * RATE_HZ)
    for start in range(0, len(audio), step):
        await send(ws, "input_audio_buffer.append", audio=b64(audio[start:start + step]))
        await trio.sleep(0 if args.fast else CHUNK_S)
    printer.speech_end_s = time.monotonic()
    if args.manual:
        await send(ws, "input_audio_buffer.commit")
        if not args.transcribe_only:
            await send(ws, "response.create")
        return
    silence = np.zeros(int(TAIL_SILENCE_S * RATE_HZ), dtype=np.float32)
    for start in range(0, len(silence), step):  # a file has no room tone after it: send some
        await send(ws, "input_audio_buffer.append", audio=b64(silence[start:start + step]))
        await trio.sleep(0 if args.fast else CHUNK_S)


async def send_mic(ws) -> None:
    try:
        import sounddevice
    except ImportError:
        sys.exit("--mic needs the sounddevice package: pip install sounddevice")
    send_blocks, blocks = trio.open_memory_channel(50)
    token = trio.lowlevel.current_trio_token()

    def callback(indata, frames, time_info, status):  # sounddevice's thread
        try:
            trio.from_thread.run_sync(send_blocks.send_nowait, indata[:, 0].copy(), trio_token=token)
        except trio.WouldBlock:
            pass  # the network is behind: drop a block rather than stall the sound card

    with sounddevice.InputStream(samplerate=RATE_HZ, channels=1, dtype="float32", blocksize=int(CHUNK_S * RATE_HZ),
                                 callback=callback):
        print("[listening: speak, pause to get an answer, Ctrl+C to stop]", file=sys.stderr)
        async for block in blocks:
            await send(ws, "input_audio_buffer.append", audio=b64(block))


async def main() -> None:
    args = parse_args()
    if not args.mic and not args.wav:
        sys.exit("give an audio file or --mic")
    headers = [(b"authorization", f"Bearer {args.api_key}".encode())] if args.api_key else []
    async with open_websocket_url(args.url, extra_headers=headers) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        turn = None if args.manual else {"type": "server_vad", "silence_duration_ms": args.silence_ms}
        session = {"type": "transcription" if args.transcribe_only else "realtime",
                   "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE_HZ}, "turn_detection": turn}}}
        if args.speak and not args.transcribe_only:
            session["output_modalities"] = ["audio"]  # the server's voice (rill serve --tts-model, espeak-ng by default)
        await send(ws, "session.update", session=session)
        printer = Printer(answer=not args.transcribe_only, speak_to=args.speak)
        async with trio.open_nursery() as nursery:
            if args.mic:
                nursery.start_soon(send_mic, ws)
            else:
                nursery.start_soon(send_file, ws, read_audio(args.wav), args, printer)
            await printer.run(ws)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass
