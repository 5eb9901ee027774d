"""The voice half of session.update: turn detection and input transcription, in the beta form
(`turn_detection`, `input_audio_transcription` on the session) and the GA form
(`audio.input.turn_detection`, `audio.input.transcription`), GA winning where both are given.

`turn_detection` left out keeps its value, `null` turns detection off (the client commits each
turn), and an object is server_vad with OpenAI's defaults for the fields it leaves out (threshold
0.5, prefix_padding_ms 300, silence_duration_ms 500, create_response and interrupt_response true),
or semantic_vad (`eagerness` low, medium, high or auto, default auto; rill.speech.semantic_vad), which
takes create_response and interrupt_response and no VAD field (OpenAI's semantic_vad has none).
"""

from __future__ import annotations

import msgspec

from rill.speech.semantic_vad import EAGERNESS
from rill.speech.vad import TurnDetection
from rill.transports.realtime.model_names import is_openai_transcription_model
from rill.transports.realtime.events import (
    RealtimeError, SessionConfig, TranscriptionSettings, TurnDetectionSettings,
)

DEFAULT_TURN_DETECTION = TurnDetection()
_VAD_FIELDS = ("threshold", "prefix_padding_ms", "silence_duration_ms")  # server_vad's own
_FLAGS = ("create_response", "interrupt_response")


def turn_detection(config: SessionConfig, current: TurnDetection | None) -> TurnDetection | None:
    given = config.turn_detection
    audio_input = config.audio.input if config.audio is not None else None
    if audio_input is not None and audio_input.turn_detection is not msgspec.UNSET:
        given = audio_input.turn_detection
    if given is msgspec.UNSET:
        return current
    if given is None:
        return None
    return _semantic_vad(given) if given.type == "semantic_vad" else _server_vad(given)


def _semantic_vad(given: TurnDetectionSettings) -> TurnDetection:
    eagerness = given.eagerness if given.eagerness is not None else "auto"
    if eagerness not in EAGERNESS:
        raise RealtimeError("invalid_value", f"turn_detection.eagerness must be one of {', '.join(EAGERNESS)}; got "
                            f"{eagerness!r}", "session.turn_detection.eagerness")
    extra = next((name for name in _VAD_FIELDS if getattr(given, name) is not None), None)
    if extra is not None:
        raise RealtimeError("invalid_value", f"turn_detection.{extra} belongs to server_vad; semantic_vad takes "
                            "eagerness, create_response and interrupt_response", f"session.turn_detection.{extra}")
    flags = {name: getattr(given, name) for name in _FLAGS if getattr(given, name) is not None}
    return TurnDetection.semantic(eagerness, **flags)


def _server_vad(given: TurnDetectionSettings) -> TurnDetection:
    if given.eagerness is not None:
        raise RealtimeError("invalid_value", "turn_detection.eagerness belongs to semantic_vad; server_vad takes "
                            "threshold, prefix_padding_ms and silence_duration_ms", "session.turn_detection.eagerness")
    fields = {name: getattr(given, name) for name in (*_VAD_FIELDS, *_FLAGS) if getattr(given, name) is not None}
    try:
        return TurnDetection(**fields)
    except ValueError as exc:
        name = next((n for n in fields if n in str(exc)), None)
        raise RealtimeError("invalid_value", f"turn_detection: {exc}",
                            f"session.turn_detection.{name}" if name else "session.turn_detection") from None


def transcription_settings(config: SessionConfig, current: TranscriptionSettings,
                           speech_models: tuple[str, ...]) -> TranscriptionSettings:
    given = config.input_audio_transcription
    if config.audio is not None and config.audio.input is not None and config.audio.input.transcription is not None:
        given = config.audio.input.transcription
    if given is None:
        return current
    model = given.model
    if is_openai_transcription_model(model) and model not in speech_models:
        model = speech_models[0] if speech_models else None  # OpenAI's name: served by the speech model
    if model is not None and speech_models and model not in speech_models:
        raise RealtimeError("model_not_found", f"the transcription model {given.model!r} does not exist; this server "
                            f"transcribes with {list(speech_models)}", "session.input_audio_transcription.model")
    return TranscriptionSettings(model=model or current.model, language=given.language or current.language,
                                 prompt=given.prompt if given.prompt is not None else current.prompt)


def turn_detection_wire(turn: TurnDetection | None) -> TurnDetectionSettings | None:
    if turn is None:
        return None
    if turn.is_semantic:
        return TurnDetectionSettings("semantic_vad", create_response=turn.create_response,
                                     interrupt_response=turn.interrupt_response, eagerness=turn.eagerness)
    return TurnDetectionSettings("server_vad", turn.threshold, turn.prefix_padding_ms, turn.silence_duration_ms,
                                 turn.create_response, turn.interrupt_response)
