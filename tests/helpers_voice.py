"""Voice tests' parts: rill's app with the LLM engine and the speech worker on 127.0.0.1 (both listeners),
espeak-ng speech made at test time, and a realtime client that streams PCM16 at a chosen pace."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import pytest
import trio
from hypercorn.trio import serve as hypercorn_serve
from quart_trio import QuartTrio
from trio_websocket import open_websocket_url

from rill.config import EngineConfig
from rill.engine.async_engine import AsyncEngine, open_engine
from rill.server import hypercorn_config
from rill.speech.async_speech import open_serving_speech
from rill.transports.http import ServerConfig, create_app
from rill.transports.realtime.driver import RealtimeConfig
from rill.transports.realtime.quart_route import realtime_hub
from rill.transports.realtime.ws_listener import serve_ws

RATE = 16_000
EVENT_TIMEOUT_S = 60
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng makes the test speech")


def speak(text: str, rate_wpm: int = 160) -> np.ndarray:
    """espeak-ng's en-us voice, 16 kHz float32, silence trimmed."""
    from rill.tiny_speech.synth import synthesize
    from rill.tiny_speech.voices import Voice

    return synthesize(text, Voice("en-us", "", rate_wpm, 50, 100, 0))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


@dataclass
class VoiceServer:
    url: str
    ws_url: str
    engine: AsyncEngine
    speech: object
    app: QuartTrio

    def realtime_url(self, listener: str) -> str:
        return self.url.replace("http://", "ws://") + "/v1/realtime" if listener == "http" else self.ws_url

    @property
    def all_kv_free(self) -> bool:
        bm = self.engine.core.block_manager
        return bm.num_free_blocks == bm.num_blocks

    @property
    def num_connections(self) -> int:
        return realtime_hub(self.app).num_connections


@asynccontextmanager
async def voice_server(llm_dir, speech_dir, server: ServerConfig | None = None, **engine_kwargs):
    # The tests speak 16 kHz PCM16 without naming the rate (the server's default is OpenAI's 24 kHz).
    server = server or ServerConfig(realtime=RealtimeConfig(ws_port=0, audio_rate_hz=RATE))
    hyper = hypercorn_config("127.0.0.1", 0, 1.0, server)
    config = EngineConfig(model=str(llm_dir), **{"num_kv_blocks": 256, **engine_kwargs})
    async with open_engine(config) as engine, \
            open_serving_speech(None if speech_dir is None else str(speech_dir)) as speech:
        app = create_app(engine=engine, server=server, speech=speech)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn_serve, app, hyper)
            ws_url = await nursery.start(serve_ws, realtime_hub(app), "127.0.0.1", 0)
            try:
                yield VoiceServer(binds[0], ws_url, engine, speech, app)
            finally:
                nursery.cancel_scope.cancel()


class VoiceClient:
    """A trio-websocket realtime client: JSON events, reads with a deadline, audio streamed at a pace.
    A reader task takes each event off the socket as it comes (so `log` has true arrival times while
    the test is busy streaming audio); `recv` hands them out in order."""

    def __init__(self, ws):
        self.ws = ws
        self._ids = itertools.count()
        self.log: list[tuple[float, dict]] = []  # every event received, with its arrival time
        self._send, self._events = trio.open_memory_channel(float("inf"))

    async def read_all(self) -> None:
        async with self._send:
            while True:
                event = json.loads(await self.ws.get_message())
                self.log.append((trio.current_time(), event))
                self._send.send_nowait(event)

    def timeline(self) -> str:
        """The events received so far, one line each (runs of one delta folded), to read a failure by."""
        rows: list[list] = []  # [seconds since the first event, description, count]
        start = self.log[0][0] if self.log else 0.0
        for at, event in self.log:
            ids = " ".join(f"{k}={event[k]}" for k in ("response_id", "item_id") if k in event)
            status = (event.get("response") or {}).get("status", "")
            line = f"{event['type']} {ids} {status}".rstrip()
            if rows and rows[-1][1] == line and "delta" in event["type"]:
                rows[-1][2] += 1
            else:
                rows.append([at - start, line, 1])
        return "\n".join(f"[{at:7.3f}] {line}" + (f" x{n}" if n > 1 else "") for at, line, n in rows)

    async def send(self, type_: str, **fields) -> str:
        event_id = f"client_{next(self._ids)}"
        await self.ws.send_message(json.dumps({"type": type_, "event_id": event_id, **fields}))
        return event_id

    async def recv(self, timeout_s: float = EVENT_TIMEOUT_S) -> dict:
        with trio.fail_after(timeout_s):
            return await self._events.receive()

    async def until(self, type_: str, timeout_s: float = EVENT_TIMEOUT_S) -> list[dict]:
        events = []
        while not events or events[-1]["type"] != type_:
            events.append(await self.recv(timeout_s))
        return events

    async def update(self, **session) -> dict:
        await self.send("session.update", session=session)
        return (await self.until("session.updated"))[-1]["session"]

    async def stream(self, audio: np.ndarray, chunk_s: float = 0.1, pace: float = 1.0) -> float:
        """Append `audio` in `chunk_s` pieces, `pace` x real time (inf: at once); the time the last piece went."""
        step = int(chunk_s * RATE)
        for i in range(0, len(audio), step):
            await self.send("input_audio_buffer.append", audio=pcm16_b64(audio[i:i + step]))
            if pace != float("inf"):
                await trio.sleep(chunk_s / pace)
        return trio.current_time()


@asynccontextmanager
async def voice_client(server: VoiceServer, listener: str = "http", **kwargs):
    async with open_websocket_url(server.realtime_url(listener), **kwargs) as ws:
        client = VoiceClient(ws)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.read_all)
            created = await client.recv()
            assert created["type"] == "session.created", created
            yield client
            nursery.cancel_scope.cancel()


def of_type(events: list[dict], type_: str) -> list[dict]:
    return [e for e in events if e["type"] == type_]


async def mode_b_echo(server: VoiceServer, audio: np.ndarray, rate: int, chunk_samples: int) -> str:
    """One Mode B completions session (prompt "Q:", echo) fed `audio` as PCM16 chunks at `rate`, finished, read
    back whole: the echoed text, once the speech worker holds nothing of it."""
    import httpx

    from helpers_server import wait_for

    sessions = "/v1/streaming_input/sessions"
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        body = {"prompt": "Q:", "max_tokens": 2, "temperature": 0, "echo": True,
                "streaming_input": {"api": "completions"}}
        session_id = (await client.post(sessions, json=body)).json()["session_id"]
        for seq, i in enumerate(range(0, len(audio), chunk_samples)):
            chunk = {"sequence_id": seq, "modality": "audio", "sample_rate": rate,
                     "payload": pcm16_b64(audio[i:i + chunk_samples])}
            assert (await client.post(f"{sessions}/{session_id}/chunks", json=chunk)).status_code == 202
        assert (await client.post(f"{sessions}/{session_id}/finish")).status_code == 202
        with trio.fail_after(60):
            while (result := await client.get(f"{sessions}/{session_id}/result")).status_code == 202:
                await trio.sleep(0.1)
        assert result.status_code == 200, result.text
    await wait_for(lambda: server.speech.core.live.num_live == 0 and server.speech.num_requests == 0)
    return result.json()["choices"][0]["text"]
