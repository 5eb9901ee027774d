"""POST /v1/audio/speech's body, as OpenAI defines it, checked into a SpeechJob (the wire is
transports/speech_http.py; the voice runs on the speech-out worker, rill.tts.worker).

    model            the voice model's served name, or one of OpenAI's TTS names (tts-1, tts-1-hd,
                     gpt-4o-mini-tts...), which the served voice answers to as the realtime names do
    input            the text, 1-4,096 characters
    voice            a name (alloy, ash, ...; or the backend's own) or {"id": name}
    response_format  mp3 (default) | opus | aac | flac | wav | pcm
    speed            0.25-4.0 (default 1.0)
    instructions     accepted and ignored: neither espeak-ng nor Kokoro takes a style prompt
    stream_format    audio (default: the encoded bytes, chunked as made) | sse (speech.audio.delta events)
"""

from __future__ import annotations

import base64

import msgspec

from rill.openai.errors import ApiError
from rill.tts.audio_out import FORMATS
from rill.tts.synthesizer import MAX_SPEED, MIN_SPEED  # OpenAI's `speed` range, one definition

MAX_INPUT_CHARS = 4096  # OpenAI's limit
STREAM_FORMATS = ("audio", "sse")
OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
OUTPUT_TOKENS_PER_SECOND = 20  # usage.output_tokens: 50 ms of audio a token (rill's count; OpenAI's is its own)


class SpeechBody(msgspec.Struct, forbid_unknown_fields=False):
    model: str
    input: str
    voice: str | dict
    response_format: str = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    stream_format: str = "audio"


class SpeechJob(msgspec.Struct, frozen=True):
    text: str
    voice: str
    response_format: str
    speed: float
    stream_format: str


def is_openai_tts_model(name: str) -> bool:
    return name in OPENAI_TTS_MODELS or name.startswith("gpt-4o-mini-tts-")


def parse_speech(body: bytes) -> tuple[str, SpeechJob]:
    """(the model named, the job); ApiError 400 for anything OpenAI would refuse."""
    try:
        parsed = msgspec.json.decode(body or b"{}", type=SpeechBody)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid request: {exc}", param=_param(str(exc)), code="invalid_request_error") from exc
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}", code="invalid_request_error") from exc
    if not parsed.input.strip():
        raise ApiError(400, "input must not be empty", param="input", code="invalid_request_error")
    if len(parsed.input) > MAX_INPUT_CHARS:
        raise ApiError(400, f"input is {len(parsed.input)} characters; at most {MAX_INPUT_CHARS}", param="input",
                       code="string_above_max_length")
    if parsed.response_format not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}; got {parsed.response_format!r}",
                       param="response_format", code="invalid_request_error")
    if parsed.stream_format not in STREAM_FORMATS:
        raise ApiError(400, f"stream_format must be audio or sse; got {parsed.stream_format!r}",
                       param="stream_format", code="invalid_request_error")
    if not MIN_SPEED <= parsed.speed <= MAX_SPEED:
        raise ApiError(400, f"speed must be between {MIN_SPEED} and {MAX_SPEED}; got {parsed.speed}", param="speed",
                       code="invalid_request_error")
    voice = parsed.voice.get("id") if isinstance(parsed.voice, dict) else parsed.voice
    if not isinstance(voice, str) or not voice:
        raise ApiError(400, "voice must be a name or {\"id\": name}", param="voice", code="invalid_request_error")
    return parsed.model, SpeechJob(parsed.input, voice, parsed.response_format, float(parsed.speed),
                                   parsed.stream_format)


def _param(message: str) -> str | None:
    # msgspec: "Expected `str`, got `int` - at `$.input`" / "Object missing required field `voice`"
    if "`$." in message:
        return message.rsplit("`$.", 1)[1].split("`")[0].split("[")[0]
    if "field `" in message:
        return message.rsplit("field `", 1)[1].split("`")[0]
    return None


def usage(characters: int, audio_seconds: float) -> dict:
    output = round(audio_seconds * OUTPUT_TOKENS_PER_SECOND)
    return {"input_tokens": characters, "output_tokens": output, "total_tokens": characters + output}


def delta_event(chunk: bytes) -> dict:
    return {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode("ascii")}


def done_event(characters: int, audio_seconds: float) -> dict:
    return {"type": "speech.audio.done", "usage": usage(characters, audio_seconds)}
