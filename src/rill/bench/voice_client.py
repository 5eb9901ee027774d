"""`rill bench voice`'s realtime client: a session on /v1/realtime, speech sent as a microphone sends it,
and the events read back into turns with their arrival times (the trio clock)."""

from __future__ import annotations

import base64
import json
from contextlib import asynccontextmanager

import numpy as np

CHUNK_S = 0.1
RATE = 16_000
EVENT_TIMEOUT_S = 120
ANSWER_WAIT_S = 10  # after the last audio, a turn waits this long for its events; then it counts as unfinished


def b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class Turn:
    """What one spoken question got, with arrival times (trio clock, seconds)."""

    def __init__(self):
        self.deltas: list[tuple[float, str]] = []
        self.commit_s: float | None = None  # when the client sent input_audio_buffer.commit (push-to-talk)
        self.errors: list[str] = []  # error events' codes (conversation_empty: nothing was heard to answer)
        self.completed_s: float | None = None
        self.transcript = ""
        self.first_token_s: float | None = None
        self.done_s: float | None = None
        self.answer = ""


async def speak(ws, audio: np.ndarray) -> float:
    """Send `audio` as a microphone would (each 100 ms when it has been spoken); the start time."""
    import trio

    start = trio.current_time()
    step = int(CHUNK_S * RATE)
    for at in range(0, len(audio), step):
        await trio.sleep_until(start + min(at + step, len(audio)) / RATE)  # a piece goes once it has been said
        await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": b64(audio[at:at + step])}))
    return start


async def read_turns(ws, turns: list[Turn], until: str) -> None:
    """Events into `turns` (one per completed transcript) until `until` has come len(turns) times (or, when
    waiting for answers, an error in their place)."""
    import trio

    index, count = 0, 0
    with trio.fail_after(EVENT_TIMEOUT_S):
        while count < len(turns):
            event = json.loads(await ws.get_message())
            now, kind = trio.current_time(), event["type"]
            turn = turns[min(index, len(turns) - 1)]
            if kind == "conversation.item.input_audio_transcription.delta":
                turn.deltas.append((now, event["delta"]))
            elif kind == "conversation.item.input_audio_transcription.completed":
                turn.completed_s, turn.transcript = now, event["transcript"]
                index += 1
            elif kind == "response.output_text.delta":
                turns[index - 1].first_token_s = turns[index - 1].first_token_s or now
                turns[index - 1].answer += event["delta"]
            elif kind == "response.done":
                turns[index - 1].done_s = now
            elif kind == "error":  # kept with its turn and reported; it ends a turn waiting for its answer
                turn.errors.append(event["error"].get("code") or event["error"].get("type", "error"))
            if kind == until or (kind == "error" and until == "response.done"):
                count += 1


async def session(url: str, settings: dict):
    """realtime_session entered by hand, for callers that close it themselves: (its context, the socket)."""
    ws_cm = realtime_session(url, settings)
    return ws_cm, await ws_cm.__aenter__()


@asynccontextmanager
async def realtime_session(url: str, settings: dict):
    """A /v1/realtime session with `settings` applied; the socket closes (and its answer with it) when the block
    ends, however it ends."""
    from trio_websocket import open_websocket_url

    settings = {"input_audio_format": {"type": "audio/pcm", "rate": 16_000}, **settings}  # the speech sent is 16 kHz
    async with open_websocket_url(url) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await ws.send_message(json.dumps({"type": "session.update", "session": settings}))
        assert json.loads(await ws.get_message())["type"] == "session.updated"
        yield ws


def vad(silence_ms: int) -> dict:
    return {"type": "server_vad", "silence_duration_ms": silence_ms}


async def bounded_read(ws, turns: list[Turn], until: str, talk) -> None:
    """Run `talk()` (the client's side) while reading events into `turns`; once it has spoken, wait at most
    ANSWER_WAIT_S for the rest (a model that writes nothing may never complete a turn: it counts unfinished)."""
    import trio

    async with trio.open_nursery() as nursery:
        async def read() -> None:
            await read_turns(ws, turns, until)
            nursery.cancel_scope.cancel()

        nursery.start_soon(read)
        await talk()
        await trio.sleep(ANSWER_WAIT_S)  # cancelled by read() as soon as everything has come
        nursery.cancel_scope.cancel()
