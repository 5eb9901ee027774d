"""POST /v1/audio/speech and GET /v1/audio/voices on the wire (the body is rill.openai.speech; the voice
runs on the speech-out worker, rill.tts.worker; encoding in a worker thread, never on trio's).

The input is cut into clauses (rill.tts.clauses) and each clause's audio leaves as soon as it is made:
with stream_format "audio" as the encoded bytes of a chunked response (what OpenAI sends), with "sse"
as speech.audio.delta events then speech.audio.done with usage. A client that leaves mid-answer
cancels the response's generator, which aborts the request on the worker.
"""

from __future__ import annotations

import logging
import time

import msgspec
import trio
from quart import Blueprint, Response, request

from rill.openai import sse
from rill.openai.errors import ApiError
from rill.openai.speech import SpeechJob, delta_event, done_event, is_openai_tts_model, parse_speech
from rill.transports.http import _error, _json, _sse, _state
from rill.tts.audio_out import CONTENT_TYPES, open_encoder
from rill.tts.backend import UnknownVoice
from rill.tts.clauses import split_text

log = logging.getLogger("rill.server")

SPEECH = "/v1/audio/speech"
VOICES = "/v1/audio/voices"
_THREADED = ("mp3", "opus", "aac", "flac")  # libsndfile / FFmpeg encode in a thread; pcm and wav are a copy

speech_api = Blueprint("speech", __name__)


def install_speech(app) -> None:
    app.register_blueprint(speech_api)


def model_names(out) -> list[str]:
    """The served names of the voice: its backend's name ("rill-espeak"; a Kokoro directory's name)."""
    return [] if out is None else [out.backend.name]


def model_cards(out, created: int) -> list:
    from rill.openai.chat_bodies import ModelCard

    return [ModelCard(name, created, 4096, task="speech", input_modalities=["text"]) for name in model_names(out)]


def _check_model(out, name: str) -> None:
    if out is None:
        raise ApiError(404, f"the model {name!r} does not exist: this server has no voice (rill serve --tts-model)",
                       param="model", code="model_not_found")
    if name not in model_names(out) and not is_openai_tts_model(name) and name != "espeak":
        raise ApiError(404, f"the model {name!r} does not exist; this server speaks with {model_names(out)}",
                       param="model", code="model_not_found")


@speech_api.post(SPEECH)
async def create_speech() -> Response:
    state = _state()
    out = getattr(state, "speech_out", None)
    started = time.perf_counter()
    try:
        model, job = parse_speech(await request.get_data())
        _check_model(out, model)
        voice = out.backend.resolve_voice(job.voice)
    except UnknownVoice as exc:
        return _finish(state, _error(ApiError(400, str(exc), param="voice", code="invalid_request_error")))
    except ApiError as exc:
        return _finish(state, _error(exc))
    body = _speak(state, out, job, voice, started)
    if job.stream_format == "sse":
        return _sse(_sse_frames(body, job))
    return Response(_bytes(body), content_type=CONTENT_TYPES[job.response_format],
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _finish(state, response: Response) -> Response:
    state.metrics.speech_requests.labels(str(response.status_code)).inc()
    return response


async def _speak(state, out, job: SpeechJob, voice: str, started: float):
    """(encoded bytes, audio seconds so far) per piece; the encoder's tail last."""
    encoder = open_encoder(job.response_format, out.backend.sample_rate)
    threaded = job.response_format in _THREADED
    seconds, first, status = 0.0, None, "499"
    try:
        async for frames in out.speak(_clauses(job.text), voice=voice, speed=job.speed):
            seconds += frames.size / out.backend.sample_rate
            data = await trio.to_thread.run_sync(encoder.write, frames) if threaded else encoder.write(frames)
            if first is None:
                first = time.perf_counter() - started
                state.metrics.speech_first_audio.observe(first)
            yield data, seconds
        yield (await trio.to_thread.run_sync(encoder.close) if threaded else encoder.close()), seconds
        status = "200"
        elapsed = time.perf_counter() - started
        state.metrics.speech_characters.inc(len(job.text))
        state.metrics.speech_audio_seconds.inc(seconds)
        if seconds > 0:
            state.metrics.speech_real_time_factor.observe(elapsed / seconds)
        log.info("speech: %d chars -> %.2f s of %s audio in %.3f s (first audio %.0f ms)", len(job.text), seconds,
                 job.response_format, elapsed, 1000 * (first or elapsed))
    finally:
        state.metrics.speech_requests.labels(status).inc()


async def _clauses(text: str):
    for clause in split_text(text):
        yield clause


async def _bytes(body):
    async for data, _ in body:
        if data:
            yield data


async def _sse_frames(body, job: SpeechJob):
    seconds = 0.0
    async for data, seconds in body:
        if data:
            yield sse.data_frame(delta_event(data))
    yield sse.data_frame(done_event(len(job.text), seconds))


@speech_api.get(VOICES)
async def list_voices() -> Response:
    """Each voice model's voices: {"object": "list", "data": [{"model", "voices": [{"id", "name", "language"}]}]}."""
    out = getattr(_state(), "speech_out", None)
    data = [] if out is None else [{"model": name, "voices": [msgspec.to_builtins(v) for v in out.backend.voices()]}
                                   for name in model_names(out)]
    return _json({"object": "list", "data": data})
