"""POST /v1/audio/transcriptions: OpenAI's multipart form in; JSON, text, subtitles or SSE out.

    file             the recording (WAV, FLAC, OGG; MP3 where libsndfile has it), at most
                     --max-audio-bytes (413 past it: at once when Content-Length says so, else
                     as soon as that much has arrived)
    model            the speech model's served name (404 model_not_found otherwise)
    language, prompt, temperature, response_format (json | text | verbose_json | srt | vtt), stream

The wire only: fields and bodies are rill.openai.transcriptions, the model runs in the speech
worker (rill.speech.async_speech), and the file is decoded in a worker thread, never on trio's.
"""

from __future__ import annotations

import itertools
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import trio
from quart import Blueprint, Response, current_app, request
from werkzeug.datastructures import FileStorage
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from rill.openai import sse
from rill.openai.errors import ApiError, from_status
from rill.openai.chat_bodies import ModelCard
from rill.openai.serving import RequestTrace, api_error, current_trace
from rill.openai.transcriptions import TextDelta, TextDone, TranscriptionRequest, parse_fields, render, token_usage
from rill.speech.audio import load_audio
from rill.transports.http import _error, _sse, _state

if TYPE_CHECKING:
    from rill.speech.decoding import SpeechDelta, Transcription

log = logging.getLogger("rill.server")

TRANSCRIPTIONS = "/v1/audio/transcriptions"
DEFAULT_MAX_AUDIO_BYTES = 25 * 1000 * 1000  # OpenAI's limit: 25 MB
# The form's other fields and the part headers ride in the same body as the file.
FORM_OVERHEAD_BYTES = 64 << 10
NUM_DECODE_THREADS = 2  # files decoded at once, each in a worker thread; more would only queue for the cores

audio_api = Blueprint("audio", __name__)


@dataclass
class SpeechServing:
    """The speech side of one app: the engine (None when serving no speech model) and its limits."""

    engine: object | None
    max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES
    created: int = field(default_factory=lambda: int(time.time()))
    decode_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(NUM_DECODE_THREADS))

    @property
    def model_names(self) -> list[str]:
        return [] if self.engine is None else [self.engine.model_name]

    def check_model(self, name: str | None) -> None:
        """The served name, or the model's own (a directory's last part, rill-tiny-speech); None: the one served."""
        if self.engine is None:
            raise ApiError(404, f"the model {name!r} does not exist: this server serves no speech model "
                                "(rill serve --speech-model)", param="model", code="model_not_found")
        if name is not None and name not in self.model_names and name != self.engine.core.model_name:
            raise ApiError(404, f"the model {name!r} does not exist; this server transcribes with {self.model_names}",
                           param="model", code="model_not_found")

    def model_cards(self) -> list[ModelCard]:
        """GET /v1/models lists these beside the LLM's cards."""
        if self.engine is None:
            return []
        runtime = self.engine.core.runtime
        return [ModelCard(name, self.created, runtime.max_model_len, root=str(runtime.path),
                          task="transcription", input_modalities=["audio"]) for name in self.model_names]

    def model_card(self, name: str) -> ModelCard | None:
        return next((card for card in self.model_cards() if card.id == name), None)


def install_transcriptions(app, engine=None, max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES) -> SpeechServing:
    """Register the route and give its requests their own body limit (every other route keeps
    MAX_CONTENT_LENGTH): the limit is set when the request object is made, before any byte is read."""
    speech = SpeechServing(engine, max_audio_bytes)
    app.extensions["rill.speech"] = speech
    app.register_blueprint(audio_api)
    base = app.request_class
    body_limit = max_audio_bytes + FORM_OVERHEAD_BYTES
    bounded_body = _bounded(base.body_class)

    class Request(base):
        def __init__(self, method, scheme, path, *args, **kwargs):
            if path == TRANSCRIPTIONS:
                kwargs["max_content_length"] = body_limit
                self.body_class = bounded_body
            super().__init__(method, scheme, path, *args, **kwargs)
            if path == TRANSCRIPTIONS:
                self.max_content_length = body_limit  # the multipart parser's own bound

    app.request_class = Request
    return speech


def _bounded(body_class):
    """Quart compares max_content_length with the bytes buffered, not with the bytes received: a body
    read as it arrives (the multipart parser reads it so) is never cut, however long. This one counts
    every byte, and past the limit keeps none and fails the reader with a 413 (Quart 0.22)."""

    class BoundedBody(body_class):
        def __init__(self, expected_content_length, max_content_length):
            super().__init__(expected_content_length, max_content_length)
            self.num_received_bytes = 0

        def append(self, data: bytes) -> None:
            self.num_received_bytes += len(data)
            if self._must_raise is None and self.num_received_bytes > self._max_content_length:
                self._must_raise = RequestEntityTooLarge()
                self.set_complete()
            super().append(data)  # a no-op once _must_raise is set

        async def __anext__(self) -> bytes:
            # Quart's Body checks _must_raise before it waits for data, not after: a reader woken by
            # the cut would see an empty, complete body and stop as if the upload had ended.
            try:
                return await super().__anext__()
            except StopAsyncIteration:
                if self._must_raise is not None:
                    raise self._must_raise from None
                raise

    return BoundedBody


def speech_serving() -> SpeechServing:
    return current_app.extensions["rill.speech"]


@audio_api.post(TRANSCRIPTIONS)
async def transcriptions() -> Response:
    speech = speech_serving()
    trace = _Trace(speech, _state().metrics)
    current_trace.set(RequestTrace(trace.request_id, TRANSCRIPTIONS))  # this route logs its own line
    try:
        req, audio = await _read_request(speech)
        trace.audio_ready_s = time.monotonic()
        params = _params(req)
        deltas = speech.engine.transcribe(audio, params, trace.request_id, speech.engine.input_rate)
        if req.stream:
            first = await _first(deltas)
            return _sse(_stream(first, deltas, trace))
        async with aclosing(deltas):
            result = await _collect(deltas)
    except trio.Cancelled:
        trace.finish(499)  # the client left
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI error body
        error = _as_error(exc, speech)
        trace.finish(error.status)
        return _error(error)
    trace.finish(200, result)
    body, content_type = render(result, req.response_format, req.temperature)
    return Response(body, content_type=content_type)


def _params(req: TranscriptionRequest):
    from rill.speech.decoding import TranscribeParams  # a server with no speech model never needs it

    return TranscribeParams(language=req.language, prompt=req.prompt, temperature=req.temperature)


async def _read_request(speech: SpeechServing) -> tuple[TranscriptionRequest, np.ndarray]:
    """The checked form and the decoded audio; ApiError or AudioError for whatever is wrong."""
    files = await request.files  # 413 here when the body passes the limit
    req = parse_fields(await request.form)
    speech.check_model(req.model)
    upload = files.get("file")
    if upload is None:
        raise ApiError(400, "send the recording as the multipart/form-data field 'file'", param="file",
                       code="missing_required_parameter")
    audio = await trio.to_thread.run_sync(_decode, upload, speech.max_audio_bytes, speech.engine.input_rate,
                                          limiter=speech.decode_limiter)
    return req, audio


def _decode(upload: FileStorage, max_audio_bytes: int, rate: int) -> np.ndarray:
    """Worker thread: the file's bytes (413 past the limit) decoded to mono float32 at the rate the model
    hears (16 kHz; Kyutai's 24 kHz), in one resample from the file's own rate."""
    data = upload.stream.read(max_audio_bytes + 1)
    if len(data) > max_audio_bytes:
        raise _too_large(max_audio_bytes)
    return load_audio(data, rate=rate)


def _too_large(max_audio_bytes: int) -> ApiError:
    return ApiError(413, f"the audio file is larger than this server's limit of {max_audio_bytes} bytes "
                         "(rill serve --max-audio-bytes)", param="file", code="request_entity_too_large")


def _as_error(exc: Exception, speech: SpeechServing) -> ApiError:
    if isinstance(exc, HTTPException):
        if exc.code == 413:  # the body limit, before the file could be measured
            return _too_large(speech.max_audio_bytes)
        return from_status(exc.code or 500, exc.description)
    return api_error(exc)


async def _first(deltas) -> SpeechDelta:
    """The first delta, so that a request the core refuses is an HTTP error, not a failed stream."""
    try:
        return await deltas.__anext__()
    except BaseException:
        await deltas.aclose()  # aborts in the core now, not when the generator is collected
        raise


async def _collect(deltas) -> Transcription:
    async for delta in deltas:
        if delta.finished is not None:
            return delta.finished
    raise ApiError(500, "the speech engine ended the request without a transcription", code="internal_error")


async def _stream(first: SpeechDelta, deltas, trace: _Trace):
    """SSE frames: transcript.text.delta for each piece of text, transcript.text.done, [DONE].
    A failure after the first frame is an `event: error` frame (the status is 200 already)."""
    try:
        async with aclosing(deltas):
            delta = first
            while delta.finished is None:
                if delta.text:
                    yield sse.data_frame(TextDelta(delta.text))
                delta = await deltas.__anext__()
        if delta.text:
            yield sse.data_frame(TextDelta(delta.text))
        yield sse.data_frame(TextDone(delta.finished.text, token_usage(delta.finished)))
        yield sse.DONE
        trace.finish(200, delta.finished)
    except Exception as exc:  # noqa: BLE001
        error = api_error(exc)
        trace.finish(error.status)
        yield sse.error_frame(error)
    finally:
        trace.finish(499)  # no-op unless the client left mid-stream


_request_ids = itertools.count()


@dataclass
class _Trace:
    """Metrics and one log line per transcription, written once however it ends."""

    speech: SpeechServing
    metrics: object
    request_id: str = field(default_factory=lambda: f"transcribe-{next(_request_ids)}")
    start_s: float = field(default_factory=time.monotonic)
    audio_ready_s: float | None = None  # the upload read and decoded: the real-time factor counts from here
    status: int | None = None

    def finish(self, status: int, result: Transcription | None = None) -> None:
        if self.status is not None:
            return
        self.status = status
        now_s = time.monotonic()
        elapsed_s = now_s - self.start_s
        audio_s = 0.0 if result is None else result.duration_s
        transcribe_s = now_s - (self.audio_ready_s or self.start_s)
        self.metrics.on_transcription(status, audio_s, transcribe_s)
        rtf = f" audio_s={audio_s:.2f} rtf={transcribe_s / max(audio_s, 1e-9):.3f} tokens={len(result.token_ids)}" \
            if result is not None else ""
        log.info("POST %s id=%s status=%d total_ms=%.1f%s", TRANSCRIPTIONS, self.request_id, status,
                 elapsed_s * 1e3, rtf)
