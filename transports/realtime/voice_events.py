"""The realtime protocol's events of recognised speech (server -> client), as msgspec structs.

OpenAI's server_vad turn events and per-item transcription events, and vLLM's `transcription.*`
events for a stream transcribed as a whole. The session's voice settings (`turn_detection`,
`input_audio_transcription`) are part of the session's schema in `events`; `voice` sends these.
"""

from __future__ import annotations

import msgspec

from rill.transports.realtime.events import ErrorDetail, ServerEvent, Usage


class SpeechStartedEvent(ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class SpeechStoppedEvent(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class TranscriptUsage(msgspec.Struct):
    seconds: float
    type: str = "duration"


class InputTranscriptionDelta(ServerEvent, tag="conversation.item.input_audio_transcription.delta"):
    item_id: str
    delta: str
    content_index: int = 0


class InputTranscriptionCompleted(ServerEvent, tag="conversation.item.input_audio_transcription.completed"):
    item_id: str
    transcript: str
    usage: TranscriptUsage
    content_index: int = 0


class InputTranscriptionFailed(ServerEvent, tag="conversation.item.input_audio_transcription.failed"):
    item_id: str
    error: ErrorDetail
    content_index: int = 0


class TranscriptionDelta(ServerEvent, tag="transcription.delta"):
    """vLLM's: words of the audio stream as they are recognised (beside OpenAI's per-item delta)."""

    delta: str


class TranscriptionDone(ServerEvent, tag="transcription.done"):
    text: str
    usage: Usage | None = None
