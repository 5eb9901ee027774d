"""Speech output for a streaming-input session (Mode A and Mode B): the answer read aloud as it is written.

A request asks for it with OpenAI's chat fields, `"modalities": ["text", "audio"]` and `"audio": {"voice":
"alloy", "format": "pcm16"}` (plus rill's `speed`), so a client that already asks OpenAI for a spoken chat
answer asks rill the same way. The answer's text deltas go through the clause splitter (rill.tts.clauses)
to the server's speech-out worker; each clause's audio joins the same SSE stream as a chunk in OpenAI's
streamed-audio shape, `choices[0].delta.audio = {"id", "data": base64 PCM16 24 kHz mono, "transcript",
"expires_at"}`, beside the text deltas, which keep coming as `delta.content` (OpenAI sends the text only
as the transcript; rill sends both, so a text client sees no difference). The stream's `[DONE]` waits for
the last clause's audio. In respond_per_chunk sessions each turn's last clause is spoken at its turn end.
If the voice fails, a chunk with no choices carries `speech_error` and the text answer goes on unspoken.
"""

from __future__ import annotations

import base64
import math
import time
from collections import deque

import msgspec
import numpy as np
import trio

from rill.errors import RillError
from rill.openai import sse
from rill.openai.errors import bad_request
from rill.tts.backend import UnknownVoice
from rill.tts.clauses import ClauseSplitter

STREAM_FORMATS = ("pcm16", "pcm")  # OpenAI streams chat audio as pcm16 only; "pcm" as /v1/audio/speech names it
AUDIO_TTL_S = 3600  # `expires_at` of OpenAI's audio object: rill keeps nothing, it only fills the field


class AudioOutput(msgspec.Struct, kw_only=True):
    """The request's `audio` field (OpenAI's chat audio parameter, with rill's `speed`)."""

    voice: str | None = None
    format: str = "pcm16"
    speed: float = 1.0


def speech_settings(req, out, *, streams: bool) -> tuple[str, float] | None:
    """(voice id, speed) when the request asks for spoken output, None when not; 400 when it cannot have it.
    `streams`: the answer is read as SSE (Mode B always is; Mode A with "stream": true)."""
    modalities = req.modalities if req.modalities is not None else (["text", "audio"] if req.audio else ["text"])
    bad = [m for m in modalities if m not in ("text", "audio")]
    if bad:
        raise bad_request(f"modalities may hold 'text' and 'audio', got {bad}", "modalities")
    if "audio" not in modalities:
        return None
    audio = req.audio or AudioOutput()
    if out is None:
        raise bad_request("audio output needs a voice and this server serves none (rill serve --tts-model "
                          "espeak|DIR)", "modalities", "unsupported")
    if not streams:
        raise bad_request("audio output streams: set \"stream\": true", "stream", "unsupported")
    if audio.format not in STREAM_FORMATS:
        raise bad_request(f"streamed audio is pcm16 (raw 16-bit 24 kHz mono), got {audio.format!r}",
                          "audio.format")
    if not 0.25 <= audio.speed <= 4.0:
        raise bad_request(f"audio.speed must be between 0.25 and 4.0, got {audio.speed}", "audio.speed")
    try:
        voice = out.backend.resolve_voice(audio.voice or _default_voice(out.backend))
    except UnknownVoice as exc:
        raise bad_request(str(exc), "audio.voice") from None
    return voice, float(audio.speed)


class RunSpeech:
    """One session's voice: `feed` text as the engine writes it, `end_turn` at a turn's end, `finish` at the
    end; `wait` returns once every clause fed is spoken into the log (or the voice failed)."""

    def __init__(self, run, out, voice: str, speed: float):
        self.run, self.out, self.voice, self.speed = run, out, voice, speed
        self.splitter = ClauseSplitter()
        self.texts: deque[str] = deque()  # clauses handed to the worker, not yet spoken
        self.audio_id = f"audio_{run.request_id}"
        self.num_clauses_spoken = 0
        self._send, recv = trio.open_memory_channel(math.inf)  # bounded by the answer's max_tokens
        self._closed = False
        self._scope = trio.CancelScope()
        self._done = trio.Event()
        run.manager.start_soon(self._speak, recv)

    def feed(self, text: str) -> None:
        self._hand_over(self.splitter.feed(text))

    def end_turn(self) -> None:
        self._hand_over(self.splitter.finish())

    def finish(self) -> None:
        self._hand_over(self.splitter.finish())
        self._closed = True
        self._send.close()

    def close(self) -> None:
        """The session closed: nothing more is spoken."""
        self._scope.cancel()
        self._closed = True
        self._send.close()

    async def wait(self) -> None:
        await self._done.wait()

    def _hand_over(self, clauses: list[str]) -> None:
        if self._closed:  # text after the end or after a close: nothing more to say
            return
        for clause in clauses:
            self.texts.append(clause)
            self._send.send_nowait(clause)

    async def _speak(self, recv: trio.MemoryReceiveChannel) -> None:
        log = self.run.session.output
        try:
            with self._scope, recv:
                async for samples in self.out.speak(recv, voice=self.voice, speed=self.speed):
                    frame = self._frame(samples, self.texts.popleft())
                    if log.is_closed:
                        return
                    log.append(frame)
                    self.num_clauses_spoken += 1
        except (RillError, ValueError) as exc:  # the voice failed: the text answer goes on without it
            if not log.is_closed:
                log.append(self._failed_frame(exc))
        finally:
            self._done.set()

    def _failed_frame(self, exc: Exception) -> bytes:
        # A chunk with no choices (as the usage chunk is), so a client's chunk parser reads it; the text goes on.
        job = self.run.job
        kind = "chat.completion.chunk" if self.run.api.name == "chat" else "text_completion"
        return sse.data_frame({"id": job.trace.request_id, "object": kind, "created": job.created, "model": job.model,
                               "choices": [], "speech_error": {"message": f"speech failed: {exc}",
                                                               "code": "speech_out_failed"}})

    def _frame(self, samples: np.ndarray, transcript: str) -> bytes:
        pcm = (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        audio = {"id": self.audio_id, "data": base64.b64encode(pcm).decode("ascii"), "transcript": transcript,
                 "expires_at": int(time.time()) + AUDIO_TTL_S}
        job = self.run.job
        if self.run.api.name == "chat":
            choice = {"index": 0, "delta": {"audio": audio}, "finish_reason": None}
            return sse.data_frame({"id": job.trace.request_id, "object": "chat.completion.chunk",
                                   "created": job.created, "model": job.model, "choices": [choice]})
        choice = {"index": 0, "text": "", "audio": audio, "finish_reason": None}
        return sse.data_frame({"id": job.trace.request_id, "object": "text_completion", "created": job.created,
                               "model": job.model, "choices": [choice]})


def _default_voice(backend) -> str:
    from rill.tts.synthesizer import default_voice

    return default_voice(backend)
