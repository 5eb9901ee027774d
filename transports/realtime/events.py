"""The realtime protocol's events as msgspec structs: JSON text frames tagged by `type`.

Names follow OpenAI's Realtime API (GA names; `response.text.*` for clients that speak the beta
dialect), plus vLLM's `transcription.*` events and `input_audio_buffer.commit.final`, plus rill's
`input_text_buffer.*` for streamed text input. Unknown fields are ignored, so clients written for
OpenAI's richer session schema work; unknown event types get an `error` event.
"""

from __future__ import annotations

import secrets
from typing import Literal

import msgspec

from rill.openai.errors import from_decode_error


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


NOT_APPLIED = " (this session.update was not applied: nothing in it changed)"


class RealtimeError(Exception):
    """A client event rill refuses; it becomes one `error` event and the connection goes on."""

    def __init__(self, code: str, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.code, self.message, self.param, self.kind = code, message, param, kind
        self.event_id: str | None = None  # the client event at fault, when known


# -- shared parts ---------------------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, omit_defaults=True):
    type: str  # input_text | text | output_text | input_audio | input_image | input_video (rill: live frames)
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None  # input_image: a data:image URL (dropped once decoded, as audio once heard)
    detail: str | None = None  # input_image: auto | low | high (read as auto)
    num_frames: int | None = None  # input_video: the frames of the live video in the message


class Item(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A conversation item, as the client creates it and as the server reports it."""

    type: Literal["message", "function_call", "function_call_output"]
    id: str | None = None
    object: str | None = None
    status: str | None = None  # completed | in_progress | incomplete
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class Tool(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A realtime tool is flat: `{"type": "function", "name", "description", "parameters"}`."""

    name: str
    type: Literal["function"] = "function"
    description: str | None = None
    parameters: dict | None = None


class ToolChoiceFunction(msgspec.Struct):
    """tool_choice naming one function: `{"type": "function", "name": ...}`."""

    name: str
    type: Literal["function"] = "function"


class RetentionRatio(msgspec.Struct):
    """truncation as a share: when the conversation outgrows the context, keep about this fraction of
    its tokens (the oldest turns leave), so that it is not cut again on the very next turn."""

    retention_ratio: float
    type: Literal["retention_ratio"] = "retention_ratio"


class AudioFormat(msgspec.Struct, omit_defaults=True):
    type: Literal["audio/pcm", "pcm16"] = "audio/pcm"
    rate: int | None = None  # 16000 or 24000 (resampled to 16000)


class TranscriptionSettings(msgspec.Struct, omit_defaults=True):
    """input_audio_transcription (beta) / audio.input.transcription (GA)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class TurnDetectionSettings(msgspec.Struct, omit_defaults=True):
    """turn_detection: server_vad's or semantic_vad's fields (OpenAI's defaults apply to what is left out)."""

    type: Literal["server_vad", "semantic_vad"] | None = None  # None: server_vad
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None  # accepted, not acted on
    eagerness: str | None = None  # semantic_vad: low, medium, high or auto (checked in voice_settings)


class AudioInput(msgspec.Struct):
    format: AudioFormat | None = None
    transcription: TranscriptionSettings | None = None
    turn_detection: TurnDetectionSettings | None | msgspec.UnsetType = msgspec.UNSET  # null: manual commit


class AudioOutput(msgspec.Struct, omit_defaults=True):
    """audio.output (GA): the spoken answer's format, voice and speed (voice_out_settings)."""

    format: dict | None = None  # {"type": "audio/pcm", "rate": 24000}, audio/pcmu, audio/pcma
    voice: str | dict | None = None
    speed: float | None = None


class AudioSettings(msgspec.Struct, omit_defaults=True):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class SessionConfig(msgspec.Struct, kw_only=True):
    """session.update's `session`: every field optional; what is left out keeps its value."""

    type: Literal["realtime", "transcription"] | None = None  # transcription: transcribe only
    model: str | None = None
    instructions: str | None = None
    modalities: list[str] | None = None  # beta name
    output_modalities: list[str] | None = None  # GA name
    input_audio_format: Literal["pcm16"] | AudioFormat | None = None  # beta
    audio: AudioSettings | None = None  # GA: audio.input.format
    temperature: float | None = None
    max_response_output_tokens: int | Literal["inf"] | None = None  # beta name
    max_output_tokens: int | Literal["inf"] | None = None  # GA name
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction | None = None
    output_mode: Literal["respond_at_end", "respond_per_chunk"] | None = None  # rill
    truncation: Literal["auto", "disabled"] | RetentionRatio | None = None  # GA
    input_audio_transcription: TranscriptionSettings | None = None  # beta
    turn_detection: TurnDetectionSettings | None | msgspec.UnsetType = msgspec.UNSET  # beta; null: manual commit
    voice: str | None = None  # beta: audio.output.voice in GA
    speed: float | None = None  # beta: audio.output.speed in GA
    output_audio_format: str | None = None  # beta: pcm16, g711_ulaw or g711_alaw


class ResponseOptions(msgspec.Struct, kw_only=True):
    """response.create's `response`: overrides for this response only."""

    instructions: str | None = None
    temperature: float | None = None
    max_response_output_tokens: int | Literal["inf"] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    output_modalities: list[str] | None = None  # GA: ["text"] or ["audio"] for this response
    modalities: list[str] | None = None  # beta name


# -- client -> server -----------------------------------------------------------------------------------------


class ClientEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    session: SessionConfig | None = None
    model: str | None = None  # vLLM sends the model at the top level


class InputAudioBufferAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str


class InputAudioBufferCommit(ClientEvent, tag="input_audio_buffer.commit"):
    final: bool = False  # vLLM: the audio stream has ended


class InputAudioBufferClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class InputTextBufferAppend(ClientEvent, tag="input_text_buffer.append"):
    delta: str


class InputTextBufferCommit(ClientEvent, tag="input_text_buffer.commit"):
    pass


class InputVideoFrameAppend(ClientEvent, tag="input_video_frame.append"):
    """vLLM's proposal (RFC #38141): one camera frame, base64 JPEG/PNG/WebP or a data:image URL."""

    image: str
    timestamp: float | None = None  # seconds (vLLM's)
    timestamp_ms: float | None = None  # or milliseconds


class InputVideoFrameCommit(ClientEvent, tag="input_video_frame.commit"):
    """vLLM's: the frames so far (and `query`, appended after them) become a user message; with a query,
    the answer starts."""

    query: str | None = None
    final: bool = False


class ConversationItemCreate(ClientEvent, tag="conversation.item.create"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    item_id: str


class ConversationItemDelete(ClientEvent, tag="conversation.item.delete"):
    item_id: str


class ConversationItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: str
    content_index: int
    audio_end_ms: int


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseOptions | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


CLIENT_EVENTS: dict[str, type[ClientEvent]] = {
    cls.__struct_config__.tag: cls
    for cls in (SessionUpdate, InputAudioBufferAppend, InputAudioBufferCommit, InputAudioBufferClear,
                InputTextBufferAppend, InputTextBufferCommit, ConversationItemCreate, ResponseCreate,
                ResponseCancel, InputVideoFrameAppend, InputVideoFrameCommit, ConversationItemRetrieve,
                ConversationItemDelete, ConversationItemTruncate)
}


class _Envelope(msgspec.Struct):
    type: str | None = None
    event_id: str | None = None


def decode_client_event(data: str) -> ClientEvent:
    """One text frame -> its event; RealtimeError (with the event_id when it could be read) if not."""
    try:
        envelope = msgspec.json.decode(data, type=_Envelope)
    except msgspec.MsgspecError as exc:
        raise _decode_error(exc) from exc
    except RecursionError as exc:  # msgspec's depth guard
        raise RealtimeError("invalid_json", "the event is nested too deeply to decode") from exc
    try:
        return msgspec.json.decode(data, type=_event_class(envelope.type))
    except (msgspec.MsgspecError, RealtimeError) as exc:
        error = exc if isinstance(exc, RealtimeError) else _decode_error(exc)
        error.event_id = envelope.event_id
        if envelope.type == "session.update":
            error.message += NOT_APPLIED
        raise error from exc


def _event_class(event_type: str | None) -> type[ClientEvent]:
    if event_type is None:
        raise RealtimeError("missing_required_parameter", "the event has no `type`", "type")
    kind = CLIENT_EVENTS.get(event_type)
    if kind is None:
        raise RealtimeError("unknown_event", f"unknown event type {event_type!r}; rill accepts "
                            f"{', '.join(CLIENT_EVENTS)}", "type")
    return kind


def _decode_error(exc: msgspec.MsgspecError) -> RealtimeError:
    api = from_decode_error(exc)
    code = "invalid_json" if api.code == "invalid_json" else api.code
    message = api.message.replace("request body", "event")
    return RealtimeError(code or "invalid_value", message, api.param)


# -- server -> client -----------------------------------------------------------------------------------------


class ServerEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str = msgspec.field(default_factory=lambda: new_id("event"))

    @property
    def type(self) -> str:
        return self.__struct_config__.tag


class ErrorDetail(msgspec.Struct):
    type: str
    code: str
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event at fault


class Error(ServerEvent, tag="error"):
    error: ErrorDetail


def error_event(error: RealtimeError, client_event_id: str | None) -> Error:
    return Error(error=ErrorDetail(error.kind, error.code, error.message, error.param, client_event_id))


class Session(msgspec.Struct, kw_only=True):
    id: str
    object: str = "realtime.session"
    type: str = "realtime"
    model: str
    instructions: str
    modalities: list[str]
    output_modalities: list[str]
    input_audio_format: AudioFormat
    temperature: float | None
    max_response_output_tokens: int | Literal["inf"]
    tools: list[Tool]
    tool_choice: str | ToolChoiceFunction
    output_mode: str
    truncation: str | RetentionRatio = "auto"
    turn_detection: TurnDetectionSettings | None = None
    input_audio_transcription: TranscriptionSettings | None = None
    audio: AudioSettings | None = None  # the GA shape of the three audio settings
    voice: str = "alloy"
    output_audio_format: str = "pcm16"
    speed: float = 1.0


class GASession(msgspec.Struct, kw_only=True):
    """The session as OpenAI's GA Realtime API reports it (RealtimeSessionCreateResponseGA), plus rill's
    output_mode."""

    type: str = "realtime"
    object: str = "realtime.session"
    id: str
    model: str
    output_modalities: list[str]
    instructions: str
    tools: list[Tool]
    tool_choice: str | ToolChoiceFunction
    max_output_tokens: int | Literal["inf"]
    truncation: str | RetentionRatio
    audio: AudioSettings
    output_mode: str


class GATranscriptionSession(msgspec.Struct, kw_only=True):
    """A GA transcription session (RealtimeTranscriptionSessionCreateResponseGA)."""

    type: str = "transcription"
    object: str = "realtime.transcription_session"
    id: str
    audio: AudioSettings


class SessionCreated(ServerEvent, tag="session.created"):
    session: object  # Session (beta), GASession or GATranscriptionSession


class SessionUpdated(ServerEvent, tag="session.updated"):
    session: object


class InputAudioBufferCommitted(ServerEvent, tag="input_audio_buffer.committed"):
    item_id: str
    previous_item_id: str | None = None


class InputAudioBufferCleared(ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class InputTextBufferCommitted(InputAudioBufferCommitted, tag="input_text_buffer.committed"):
    """rill's: the streamed text became user message `item_id` (shaped as its audio twin)."""


class ConversationItemCreated(ServerEvent, tag="conversation.item.created"):
    """The beta's name; GA clients get conversation.item.added, then .done once the item is complete."""

    item: Item
    previous_item_id: str | None = None


class ConversationItemAdded(ConversationItemCreated, tag="conversation.item.added"):
    pass


class ConversationItemDone(ConversationItemCreated, tag="conversation.item.done"):
    pass


class ConversationItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    item: Item


class ConversationItemDeleted(ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class InputTokenDetails(msgspec.Struct):
    cached_tokens: int
    text_tokens: int
    audio_tokens: int = 0


class OutputTokenDetails(msgspec.Struct):
    text_tokens: int
    audio_tokens: int = 0


class Usage(msgspec.Struct):
    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: OutputTokenDetails


class StatusDetails(msgspec.Struct, omit_defaults=True):
    type: str  # cancelled | incomplete | failed
    reason: str | None = None  # client_cancelled | interrupted | max_output_tokens
    error: ErrorDetail | None = None


class Response(msgspec.Struct, kw_only=True):
    id: str
    object: str = "realtime.response"
    status: str  # in_progress | completed | cancelled | incomplete | failed
    status_details: StatusDetails | None = None
    output: list[Item] = []
    usage: Usage | None = None
    conversation_id: str | None = None  # None: out of band (respond_per_chunk's interim answers)
    output_modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])
    max_output_tokens: int | Literal["inf"] = "inf"


class ResponseCreated(ServerEvent, tag="response.created"):
    response: Response


class ResponseDone(ServerEvent, tag="response.done"):
    response: Response


class OutputItemAdded(ServerEvent, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: Item


class OutputItemDone(ServerEvent, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: Item


class ContentPartAdded(ServerEvent, tag="response.content_part.added"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class ContentPartDone(ServerEvent, tag="response.content_part.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class OutputTextDelta(ServerEvent, tag="response.output_text.delta"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


class OutputTextDone(ServerEvent, tag="response.output_text.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


class BetaTextDelta(OutputTextDelta, tag="response.text.delta"):
    pass


class BetaTextDone(OutputTextDone, tag="response.text.done"):
    pass


class FunctionCallArgumentsDelta(ServerEvent, tag="response.function_call_arguments.delta"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class FunctionCallArgumentsDone(ServerEvent, tag="response.function_call_arguments.done"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


_encoder = msgspec.json.Encoder()


def encode(event: ServerEvent) -> str:
    return _encoder.encode(event).decode()
