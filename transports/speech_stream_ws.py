"""WS /v1/audio/speech/stream: text in pieces in, speech in pieces out (vLLM-Omni's protocol, rill.tts.stream_events).

Per connection, a reader takes the client's messages and cuts the text into clauses as it arrives
(rill.tts.clauses); a speaker hands each utterance's clauses to the server's speech-out worker and
sends every clause's audio as soon as the worker gives it back. The voice starts at the first clause
boundary and never waits for input.done. The reader feels the speaker's pace: at most
MAX_UTTERANCES_AHEAD utterances wait for their voice, then it stops reading (the client's socket fills).
"""

from __future__ import annotations

import io
import math
from collections import deque
from dataclasses import dataclass, field

import msgspec
import numpy as np
import soundfile as sf
import trio
from quart import Blueprint, Response, current_app, websocket

from rill.errors import RillError
from rill.openai.errors import ApiError
from rill.transports.api_keys import bearer_matches
from rill.tts.backend import UnknownVoice
from rill.tts.stream_events import (CONFIG_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_UTTERANCE_CHARS, SessionConfig,
                                    StreamError, audio_done, audio_start, decode_config, decode_text,
                                    make_splitter, parse_message, session_done)

PATH = "/v1/audio/speech/stream"
MAX_UTTERANCES_AHEAD = 4  # utterances flushed (input.done) and still waiting for their voice
FRAME_SAMPLES = 12_000  # binary frames of half a second at 24 kHz: a player starts on the first

speech_stream_api = Blueprint("speech_stream", __name__)


@dataclass
class _Utterance:
    index: int
    clauses: trio.MemorySendChannel
    pending: trio.MemoryReceiveChannel
    texts: deque[str] = field(default_factory=deque)  # clauses handed to the worker, not yet spoken
    num_chars: int = 0


class SpeechStream:
    """One connection. `ws` has receive() -> str | bytes, send(str | bytes) and close(code, reason);
    `out` is the speech-out worker (rill.tts.worker: .backend, .speak(clauses, voice=, speed=))."""

    def __init__(self, ws, out, *, config_timeout_s: float = CONFIG_TIMEOUT_S,
                 idle_timeout_s: float = IDLE_TIMEOUT_S):
        self.ws, self.out = ws, out
        self.config: SessionConfig | None = None
        self.voice = ""
        self.splitter = make_splitter("clause")
        self.current: _Utterance | None = None
        self.num_utterances = 0
        self.num_speaking = 0  # utterances handed to the speaker and not yet done
        self.timeouts = (config_timeout_s, idle_timeout_s)

    async def run(self) -> None:
        """Until the client leaves, sends session.close (what was flushed is spoken first; text after the
        last input.done is dropped, as vLLM-Omni drops it), or is closed for a fatal error or idleness."""
        send, recv = trio.open_memory_channel(MAX_UTTERANCES_AHEAD)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._speak_all, recv)
            async with send:
                closing = await self._read_all(send)
            if not closing or self.current is not None:
                nursery.cancel_scope.cancel()
        if closing:
            await self.ws.close(1000, "session.close")

    # -- the reader --------------------------------------------------------------------------------

    async def _read_all(self, utterances: trio.MemorySendChannel) -> bool:
        """True at session.close; False once the connection was closed here (a fatal error, idleness)."""
        while True:
            raw = await self._receive()
            if raw is None:
                return False
            try:
                kind, message = parse_message(raw)
                if kind == "session.close":
                    return True
                await self._take(kind, message, utterances)
            except StreamError as exc:
                await self._send_json(exc.event())
                if exc.fatal:
                    await self.ws.close(1008, exc.code)
                    return False

    async def _receive(self) -> str | bytes | None:
        """The next message; None once the client has said nothing for too long (it is told why)."""
        while True:
            timeout_s = self.timeouts[0] if self.config is None else self.timeouts[1]
            with trio.move_on_after(timeout_s):
                return await self.ws.receive()
            if self.num_speaking and self.config is not None:
                continue  # the client listens to audio still coming: not idle
            what = "session.config" if self.config is None else "a message"
            await self._send_json(StreamError(f"no {what} for {timeout_s:g} s; the connection is closed",
                                              "idle_timeout").event())
            await self.ws.close(1000, "idle_timeout")
            return None

    async def _take(self, kind: str, message: dict, utterances: trio.MemorySendChannel) -> None:
        if kind == "session.config":
            self._configure(message)
        elif self.config is None:
            raise StreamError(f"the first message must be session.config, got {kind!r}", "missing_session_config",
                              "type", fatal=True)
        elif kind == "input.text":
            await self._text(decode_text(message), utterances)
        elif kind == "input.done":
            utterance = await self._utterance(utterances)
            self._hand_over(utterance, self.splitter.finish())
            utterance.clauses.close()
            self.current = None
        else:
            raise StreamError(f"unknown message type {kind!r}", "unknown_event", "type")

    def _configure(self, message: dict) -> None:
        first = self.config is None
        if self.current is not None:
            raise StreamError("session.config cannot change an utterance in progress; send input.done first",
                              "utterance_in_progress")
        try:
            config = decode_config(message)
            backend = self.out.backend
            if config.model is not None and config.model != backend.name:
                raise StreamError(f"the model {config.model!r} does not exist; this stream speaks with "
                                  f"{backend.name!r}", "model_not_found", "model")
            voice = backend.resolve_voice(config.voice or _default_voice(backend))
        except UnknownVoice as exc:
            raise StreamError(str(exc), "invalid_value", "voice", fatal=first) from None
        except StreamError as exc:
            exc.fatal = first
            raise
        self.config, self.voice = config, voice
        self.splitter = make_splitter(config.split_granularity)

    async def _text(self, text: str, utterances: trio.MemorySendChannel) -> None:
        utterance = self.current
        num_chars = (utterance.num_chars if utterance is not None else 0) + len(text)
        if num_chars > MAX_UTTERANCE_CHARS:
            raise StreamError(f"this utterance's text would reach {num_chars} characters, over the limit of "
                              f"{MAX_UTTERANCE_CHARS}; send input.done to start another", "text_too_long", "text")
        if not text:
            return
        utterance = await self._utterance(utterances)
        utterance.num_chars = num_chars
        self._hand_over(utterance, self.splitter.feed(text))

    async def _utterance(self, utterances: trio.MemorySendChannel) -> _Utterance:
        if self.current is None:
            send, recv = trio.open_memory_channel(math.inf)  # bounded by MAX_UTTERANCE_CHARS
            self.current = _Utterance(self.num_utterances, send, recv)
            self.num_utterances += 1
            self.num_speaking += 1
            await utterances.send(self.current)  # waits while MAX_UTTERANCES_AHEAD wait for the voice
        return self.current

    @staticmethod
    def _hand_over(utterance: _Utterance, clauses: list[str]) -> None:
        for clause in clauses:
            utterance.texts.append(clause)
            utterance.clauses.send_nowait(clause)

    # -- the speaker -------------------------------------------------------------------------------

    async def _speak_all(self, utterances: trio.MemoryReceiveChannel) -> None:
        async with utterances:
            async for utterance in utterances:
                await self._speak(utterance)
                self.num_speaking -= 1

    async def _speak(self, utterance: _Utterance) -> None:
        config, rate = self.config, self.out.backend.sample_rate
        index = 0
        try:
            async with utterance.pending:
                async for samples in self.out.speak(utterance.pending, voice=self.voice, speed=config.speed):
                    text = utterance.texts.popleft()
                    await self._send_json(audio_start(utterance.index, index, text, config.response_format, rate))
                    num_bytes = 0
                    for frame in encode_frames(samples, rate, config.response_format):
                        await self.ws.send(frame)
                        num_bytes += len(frame)
                    await self._send_json(audio_done(utterance.index, index, num_bytes))
                    index += 1
        except (RillError, ValueError) as exc:  # the voice failed: this utterance ends with what was said
            await self._send_json(StreamError(f"speech failed: {exc}", "speech_failed").event())
        await self._send_json(session_done(utterance.index, index))

    async def _send_json(self, event: dict) -> None:
        await self.ws.send(msgspec.json.encode(event).decode())


def encode_frames(samples: np.ndarray, sample_rate: int, fmt: str) -> list[bytes]:
    """One clause's audio as binary frames: pcm in half-second pieces, wav as one file."""
    pcm = (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).astype("<i2")
    if fmt == "wav":
        buffer = io.BytesIO()
        sf.write(buffer, pcm, sample_rate, format="WAV", subtype="PCM_16")
        return [buffer.getvalue()]
    return [pcm[i:i + FRAME_SAMPLES].tobytes() for i in range(0, len(pcm), FRAME_SAMPLES)]


def _default_voice(backend) -> str:
    from rill.tts.synthesizer import default_voice

    return default_voice(backend)


# -- the route -----------------------------------------------------------------------------------------


class _QuartSocket:
    async def receive(self) -> str | bytes:
        data = await websocket.receive()  # the client leaving cancels this task (quart-trio)
        return b"" if data is None else data

    async def send(self, data: str | bytes) -> None:
        await websocket.send(data)

    async def close(self, code: int, reason: str) -> None:
        await websocket.close(code, reason)


def install_speech_stream(app, get_out) -> None:
    """Add the route; `get_out()` gives the speech-out worker, or None when the server has no voice."""
    app.extensions["rill.speech_stream"] = get_out
    app.register_blueprint(speech_stream_api)


@speech_stream_api.websocket(PATH)
async def speech_stream_route():
    refusal = _refusal()
    if refusal is not None:
        return Response(msgspec.json.encode(refusal.body), status=refusal.status, content_type="application/json")
    await websocket.accept()
    out = current_app.extensions["rill.speech_stream"]()
    # The timeouts are read here, not bound at import, so a test can shorten them.
    await SpeechStream(_QuartSocket(), out, config_timeout_s=CONFIG_TIMEOUT_S, idle_timeout_s=IDLE_TIMEOUT_S).run()
    return None


def _refusal() -> ApiError | None:
    """Host, Origin and the API key are checked at the upgrade, as on /v1/realtime."""
    state = current_app.extensions["rill"]
    headers = {name.lower(): value for name, value in websocket.headers.items()}
    refused = state.cross_site.refusal("", headers)
    if refused is not None:
        return ApiError(refused.status, refused.message, code=refused.code)
    key = state.server.api_key
    if key is not None and not bearer_matches(headers.get("authorization", ""), key):
        return ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'",
                        code="invalid_api_key")
    if current_app.extensions["rill.speech_stream"]() is None:
        return ApiError(404, "this server serves no voice (rill serve --tts-model espeak|DIR)",
                        code="model_not_found")
    return None
