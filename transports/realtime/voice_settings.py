"""The voice half of session.update: turn detection and input transcription, in the beta form
(`turn_detection`, `input_audio_transcription` on the session) and the GA form
(`audio.input.turn_detection`, `audio.input.transcription`), GA winning where both are given.

`turn_detection` left out keeps its value, `null` turns detection off (the client commits each
turn), and an object is server_vad with OpenAI's defaults for the fields it leaves out (threshold
0.5, prefix_padding_ms 300, silence_duration_ms 500, create_response and interrupt_response true).
"""

from __future__ import annotations

import msgspec

from rill.speech.vad import TurnDetection
from rill.transports.realtime.events import (
    RealtimeError, SessionConfig, TranscriptionSettings, TurnDetectionSettings,
)

DEFAULT_TURN_DETECTION = TurnDetection()


def turn_detection(config: SessionConfig, current: TurnDetection | None) -> TurnDetection | None:
    given = config.turn_detection
    audio_input = config.audio.input if config.audio is not None else None
    if audio_input is not None and audio_input.turn_detection is not msgspec.UNSET:
        given = audio_input.turn_detection
    if given is msgspec.UNSET:
        return current
    if given is None:
        return None
    return _server_vad(given)


def _server_vad(given: TurnDetectionSettings) -> TurnDetection:
    if given.type not in (None, "server_vad"):
        raise RealtimeError("invalid_value", f"turn_detection type {given.type!r} is not supported: rill detects turns "
                            "with server_vad (WebRTC's VAD), or none (null) for manual commits",
                            "session.turn_detection.type")
    fields = {name: getattr(given, name) for name in TurnDetection.__struct_fields__
              if getattr(given, name) is not None}
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
    if given.model is not None and speech_models and given.model not in speech_models:
        raise RealtimeError("model_not_found", f"the transcription model {given.model!r} does not exist; this server "
                            f"transcribes with {list(speech_models)}", "session.input_audio_transcription.model")
    return TranscriptionSettings(model=given.model or current.model, language=given.language or current.language,
                                 prompt=given.prompt if given.prompt is not None else current.prompt)


def turn_detection_wire(turn: TurnDetection | None) -> TurnDetectionSettings | None:
    if turn is None:
        return None
    return TurnDetectionSettings("server_vad", turn.threshold, turn.prefix_padding_ms, turn.silence_duration_ms,
                                 turn.create_response, turn.interrupt_response)
