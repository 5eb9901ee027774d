"""POST /v1/audio/transcriptions without the wire: the form's fields in, OpenAI's bodies out.

Sans-IO (STYLE.md principle 8): the HTTP route and `rill transcribe` share it. The shapes follow
OpenAI's API reference (audio/createTranscription and its streaming events):

    json          {"text": ..., "usage": {"type": "duration", "seconds": ...}}
    text          the text and a newline, text/plain
    verbose_json  {"task", "language", "duration", "text", "segments": [...], "usage"}
    srt, vtt      one cue per segment (a segment is one window of the model, see rill.speech.core)
    stream=true   data: {"type": "transcript.text.delta", "delta": ...} frames, then one
                  data: {"type": "transcript.text.done", "text": ..., "usage": {"type": "tokens", ...}}
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import msgspec

from rill.openai.errors import ApiError, bad_request

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
ENCODER_FRAMES_PER_S = 50  # Whisper's encoder: one position per 20 ms of audio (two 10 ms mel frames)
MEL_FRAMES_PER_S = 100  # verbose_json's `seek` counts 10 ms mel frames, as Whisper's does
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


class TranscriptionRequest(msgspec.Struct, frozen=True):
    """The form's fields other than `file`, checked."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float = 0.0
    stream: bool = False


def parse_fields(fields: Mapping[str, str]) -> TranscriptionRequest:
    """The text fields of the multipart form -> TranscriptionRequest; ApiError 400 names a bad field.
    Fields rill does not use (timestamp_granularities[], include[], chunking_strategy) are ignored."""
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; got {response_format!r}",
                          "response_format")
    return TranscriptionRequest(
        model=fields.get("model") or None,
        language=fields.get("language") or None,
        prompt=fields.get("prompt") or None,
        response_format=response_format,
        temperature=_temperature(fields.get("temperature")),
        stream=_flag(fields.get("stream"), "stream"),
    )


def _temperature(value: str | None) -> float:
    if value is None or value == "":
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        raise bad_request(f"temperature must be a number; got {value!r}", "temperature", "invalid_type") from None
    if not 0.0 <= temperature <= 1.0:  # OpenAI's range for transcriptions
        raise bad_request(f"temperature must be between 0 and 1; got {temperature}", "temperature")
    return temperature


def _flag(value: str | None, name: str) -> bool:
    text = (value or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise bad_request(f"{name} must be true or false; got {value!r}", name, "invalid_type")


# -- bodies ----------------------------------------------------------------------------------------


class DurationUsage(msgspec.Struct):
    seconds: float
    type: str = "duration"


class InputTokenDetails(msgspec.Struct):
    audio_tokens: int
    text_tokens: int


class TokenUsage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: InputTokenDetails
    type: str = "tokens"


class TranscriptionJson(msgspec.Struct):
    text: str
    usage: DurationUsage


class VerboseSegment(msgspec.Struct):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    compression_ratio: float
    # Whisper's decoder gives these; rill's core does not track log-probabilities yet, so they are null
    # rather than made up (the openai SDK reads the body without validating it).
    avg_logprob: float | None = None
    no_speech_prob: float | None = None


class TranscriptionVerboseJson(msgspec.Struct):
    task: str
    language: str
    duration: float
    text: str
    segments: list[VerboseSegment]
    usage: DurationUsage


class TextDelta(msgspec.Struct):
    delta: str
    type: str = "transcript.text.delta"


class TextDone(msgspec.Struct):
    text: str
    usage: TokenUsage
    type: str = "transcript.text.done"


def render(transcription, response_format: str, temperature: float = 0.0) -> tuple[bytes, str]:
    """A finished Transcription as the body and content type `response_format` asks for."""
    if response_format == "json":
        return msgspec.json.encode(TranscriptionJson(transcription.text, duration_usage(transcription))), JSON
    if response_format == "verbose_json":
        return msgspec.json.encode(verbose_json(transcription, temperature)), JSON
    if response_format == "text":
        return (transcription.text + "\n").encode(), TEXT
    if response_format == "srt":
        return srt(transcription.segments).encode(), TEXT
    if response_format == "vtt":
        return vtt(transcription.segments).encode(), VTT
    raise ApiError(400, f"unknown response_format {response_format!r}", param="response_format", code="invalid_value")


JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
VTT = "text/vtt; charset=utf-8"


def duration_usage(transcription) -> DurationUsage:
    """What whisper-1 reports: the audio's length, in whole seconds rounded up."""
    return DurationUsage(float(math.ceil(transcription.duration_s)))


def token_usage(transcription, num_prompt_tokens: int = 0) -> TokenUsage:
    """The stream's usage: audio tokens are the encoder positions the audio fills (50 a second)."""
    audio_tokens = math.ceil(transcription.duration_s * ENCODER_FRAMES_PER_S)
    input_tokens = audio_tokens + num_prompt_tokens
    output_tokens = len(transcription.token_ids)
    return TokenUsage(input_tokens, output_tokens, input_tokens + output_tokens,
                      InputTokenDetails(audio_tokens, num_prompt_tokens))


def verbose_json(transcription, temperature: float = 0.0) -> TranscriptionVerboseJson:
    segments = [
        VerboseSegment(s.id, round(s.start * MEL_FRAMES_PER_S), s.start, s.end, s.text, list(s.token_ids), temperature,
                       compression_ratio(s.text))
        for s in transcription.segments
    ]
    return TranscriptionVerboseJson("transcribe", language_name(transcription.language), transcription.duration_s,
                                    transcription.text, segments, duration_usage(transcription))


def compression_ratio(text: str) -> float:
    """Whisper's repetition check: the text's bytes over its zlib-compressed bytes."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def srt(segments) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    cues = [f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text.strip()}\n"
            for i, s in enumerate(segments, start=1)]
    return "\n".join(cues) + ("\n" if cues else "")


def vtt(segments) -> str:
    """WebVTT: the header, then one `HH:MM:SS.mmm --> HH:MM:SS.mmm` cue per segment."""
    cues = [f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text.strip()}\n\n" for s in segments]
    return "WEBVTT\n\n" + "".join(cues)


def timestamp(seconds: float, decimal_marker: str) -> str:
    ms = round(max(seconds, 0.0) * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def language_name(code: str) -> str:
    """verbose_json names the language in English words, as OpenAI does ("english"); unknown codes stay."""
    return LANGUAGE_NAMES.get(code, code)


# Whisper's language codes and names (openai/whisper, whisper/tokenizer.py LANGUAGES).
LANGUAGE_NAMES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian", "kn": "kannada",
    "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be": "belarusian",
    "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan",
    "tl": "tagalog", "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala",
    "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}
