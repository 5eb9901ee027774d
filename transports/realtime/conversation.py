"""A realtime connection's state that outlives one response: the session settings and the
conversation items, and how they become a prompt (the chat template over the items as chat
messages, with `instructions` as the system message and the session's tools)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import msgspec

from rill.errors import ValidationError
from rill.openai.constraints import auto_calls_constraint, forced_call_constraint
from rill.openai.errors import ApiError
from rill.openai.serving import Serving
from rill.openai.forced_prefix import ForcedPrefix, call_start, split_forced_prefix
from rill.sampling_params import SamplingParams
from rill.transports.realtime.audio_input import OPENAI_RATE_HZ, SUPPORTED_RATES_HZ
from rill.transports.realtime.model_names import is_openai_realtime_model
from rill.transports.realtime.events import (
    AudioFormat, AudioInput, AudioSettings, ContentPart, GASession, GATranscriptionSession, Item, RealtimeError,
    ResponseOptions, RetentionRatio, Session, SessionConfig, Tool, ToolChoiceFunction, TranscriptionSettings, new_id,
)
from rill.transports.realtime.voice_out_settings import VoiceOut, modalities_wire, output_wire, voice_out
from rill.transports.realtime.voice_settings import (
    DEFAULT_TURN_DETECTION, TurnDetection, transcription_settings, turn_detection, turn_detection_wire,
)

OUTPUT_MODES = ("respond_at_end", "respond_per_chunk")
_TEXT_PARTS = {"user": ("input_text", "text"), "system": ("input_text", "text"),
               "assistant": ("text", "output_text")}


def as_realtime_error(exc: Exception) -> RealtimeError:
    """rill's own validation errors, in the realtime protocol's shape."""
    if isinstance(exc, RealtimeError):
        return exc
    if isinstance(exc, ApiError):
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        return RealtimeError(exc.code or "invalid_value", exc.message, exc.param, kind)
    if isinstance(exc, ValidationError):
        return RealtimeError(exc.code, exc.message, exc.param)
    raise exc


@dataclass
class Settings:
    """The session as session.update leaves it."""

    model: str
    instructions: str = ""
    temperature: float | None = None  # None: the model's generation_config, then 1.0
    max_output_tokens: int | None = None  # None: "inf", the room left in the context
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | ToolChoiceFunction = "auto"
    output_mode: str = "respond_at_end"
    truncation: str | RetentionRatio = "auto"  # or "disabled": a conversation past the context is an error
    audio_rate_hz: int = OPENAI_RATE_HZ  # the connection sets the server's default (RealtimeConfig)
    rate_named: bool = False  # the client named the input format (a vLLM-style update then keeps it)
    session_type: str = "realtime"  # or "transcription": transcribe speech, answer nothing
    turn_detection: TurnDetection | None = DEFAULT_TURN_DETECTION  # None: turns end at input_audio_buffer.commit
    transcription: TranscriptionSettings = field(default_factory=TranscriptionSettings)
    voice_out: VoiceOut = VoiceOut()  # output modalities, voice, speed, output format
    speaks: bool = False  # the server has a voice (a speech-out worker): ["audio"] is honoured

    @property
    def template_tools(self) -> list[dict] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [{"type": "function", "function": msgspec_dict(t, exclude=("type",))} for t in self.tools]

    @property
    def tool_prefix(self) -> str:
        """The start of a call, written after the answer's start, when tool_choice forces one."""
        choice = self.tool_choice
        if choice == "required":
            return call_start(None)
        if isinstance(choice, ToolChoiceFunction):
            return call_start(choice.name)
        return ""

    def forced(self, tokenizer) -> ForcedPrefix:
        """tool_prefix cut on a token boundary: what the prompt ends with, and what the output must
        begin with (the call's grammar starts there), as chat completions do (rill.openai.forced_prefix)."""
        return split_forced_prefix(tokenizer, self.tool_prefix) if self.tool_prefix else ForcedPrefix("", "")

    def update(self, config: SessionConfig, serving: Serving, speech_models: tuple[str, ...] = (),
               resolve_voice=None) -> None:
        """Apply a session.update after validating all of it (nothing changes when it fails).

        A session whose model is the speech model (vLLM's clients name it) transcribes only.
        `resolve_voice` checks a voice name (the speech-out worker's; None: the server has no voice)."""
        new = Settings(**self.__dict__)
        if config.model is not None and config.model in speech_models:
            new.session_type = "transcription"
        elif config.model is not None and not (is_openai_realtime_model(config.model)
                                               and config.model not in serving.model_names):
            new.model = serving.check_model(config.model)  # OpenAI's own names: this model serves them
        new.session_type = config.type or new.session_type
        new.transcription = transcription_settings(config, new.transcription, speech_models)
        new.turn_detection = turn_detection(config, new.turn_detection)
        for name in ("instructions", "temperature", "tool_choice", "output_mode", "tools", "truncation"):
            if getattr(config, name) is not None:
                setattr(new, name, getattr(config, name))
        limit = config.max_output_tokens if config.max_output_tokens is not None else config.max_response_output_tokens
        if limit is not None:
            new.max_output_tokens = _token_limit(limit, "session.max_response_output_tokens")
        new.voice_out = voice_out(config, new.voice_out, resolve_voice)
        _check_truncation(new.truncation)
        _check_tool_choice(new, serving)
        rate = _audio_rate(config)
        if rate is not None:
            new.audio_rate_hz, new.rate_named = rate, True
        new.sampling_params(serving)  # validates temperature
        self.__dict__.update(new.__dict__)

    def sampling_params(self, serving: Serving, options: ResponseOptions | None = None) -> SamplingParams:
        fields = {"max_tokens": self.max_tokens(options)}
        temperature = options.temperature if options and options.temperature is not None else self.temperature
        if temperature is not None:
            fields["temperature"] = temperature
        try:
            params = SamplingParams.from_generation_config(serving.generation_config, **fields)
            serving.check_params(params)
            params.grammar = serving.compile_grammar(self._forced_call(serving) or self._auto_calls(serving))
        except ValidationError as exc:
            raise RealtimeError(exc.code, exc.message, f"session.{exc.param}") from exc
        return params

    def _forced_call(self, serving: Serving):
        """A forced call's grammar (rill.openai.constraints): its arguments fit the function's parameters."""
        if not self.tool_prefix:
            return None
        name = None if self.tool_choice == "required" else self.tool_choice.name
        functions = [(t.name, t.parameters) for t in self.tools]
        output_text = self.forced(serving.tokenizer).output_text
        return forced_call_constraint(functions, name, output_text, serving.grammars.special_tags,
                                      "tools[{}].parameters")

    def _auto_calls(self, serving: Serving):
        """tool_choice "auto": text, or calls to the session's tools with valid arguments, as on chat."""
        if self.tool_choice != "auto" or not self.tools or serving.options.tool_call_parser is None:
            return None
        functions = [(t.name, t.parameters, False) for t in self.tools]  # realtime tools have no `strict`
        return auto_calls_constraint(functions, True, serving.grammars.special_tags, "tools[{}].parameters")

    def max_tokens(self, options: ResponseOptions | None) -> int | None:
        if options is not None:
            limit = options.max_output_tokens if options.max_output_tokens is not None \
                else options.max_response_output_tokens
            if limit is not None:
                return _token_limit(limit, "response.max_output_tokens")
        return self.max_output_tokens

    def wire(self, session_id: str, ga: bool = True):
        """The session as session.created / .updated report it: OpenAI's GA shape, or the beta's."""
        audio = AudioSettings(AudioInput(AudioFormat("audio/pcm", self.audio_rate_hz), self.transcription,
                                         turn_detection_wire(self.turn_detection)), output_wire(self.voice_out))
        if ga and self.session_type == "transcription":
            return GATranscriptionSession(id=session_id, audio=audio)
        if ga:
            return GASession(id=session_id, model=self.model, output_modalities=self.output_modalities,
                             instructions=self.instructions, tools=self.tools, tool_choice=self.tool_choice,
                             max_output_tokens=self._max_wire, truncation=self.truncation, audio=audio,
                             output_mode=self.output_mode)
        return Session(
            id=session_id, model=self.model, instructions=self.instructions,
            modalities=["text", "audio"] if self.output_modalities == ["audio"] else ["text"],
            output_modalities=self.output_modalities, input_audio_format=AudioFormat("audio/pcm", self.audio_rate_hz),
            temperature=self.temperature, tools=self.tools, tool_choice=self.tool_choice,
            max_response_output_tokens=self._max_wire,
            output_mode=self.output_mode, truncation=self.truncation, type=self.session_type,
            turn_detection=turn_detection_wire(self.turn_detection),
            input_audio_transcription=self.transcription,
            audio=audio, voice=self.voice_out.voice, output_audio_format=self.voice_out.format.name,
            speed=self.voice_out.speed,
        )

    @property
    def output_modalities(self) -> list[str]:
        return modalities_wire(self.voice_out, self.speaks)

    @property
    def _max_wire(self) -> int | str:
        return "inf" if self.max_output_tokens is None else self.max_output_tokens


def msgspec_dict(value, exclude: tuple[str, ...] = ()) -> dict:
    return {k: v for k, v in msgspec.to_builtins(value).items() if k not in exclude}


def _check_truncation(truncation: str | RetentionRatio) -> None:
    if isinstance(truncation, RetentionRatio) and not 0.0 < truncation.retention_ratio <= 1.0:
        raise RealtimeError("invalid_value", "session.truncation.retention_ratio must be above 0 and at most 1; "
                            f"got {truncation.retention_ratio}", "session.truncation.retention_ratio")


def _token_limit(value: int | str, param: str) -> int | None:
    if value == "inf":
        return None
    if value < 1:
        raise RealtimeError("invalid_value", f"{param} must be at least 1 or \"inf\"; got {value}", param)
    return value


def _check_tool_choice(settings: Settings, serving: Serving) -> None:
    choice = settings.tool_choice
    if choice in ("auto", "none"):
        return
    if not settings.tools:
        raise RealtimeError("invalid_value", "tool_choice asks for a tool call but the session has no tools",
                            "session.tool_choice")
    if serving.options.tool_call_parser is None:
        raise RealtimeError("unsupported", "a forced tool_choice needs a tool-call parser (--tool-call-parser)",
                            "session.tool_choice")
    if isinstance(choice, ToolChoiceFunction) and choice.name not in {t.name for t in settings.tools}:
        raise RealtimeError("invalid_value", f"tool_choice names {choice.name!r}, which is not among the tools",
                            "session.tool_choice")


def _audio_rate(config: SessionConfig) -> int | None:
    fmt = config.input_audio_format
    if config.audio is not None and config.audio.input is not None:
        fmt = config.audio.input.format or fmt
    if fmt is None:
        return None
    rate = fmt.rate if isinstance(fmt, AudioFormat) else OPENAI_RATE_HZ  # beta's "pcm16" is 24 kHz
    rate = OPENAI_RATE_HZ if rate is None else rate  # GA's audio/pcm is 24 kHz
    if rate is not None and rate not in SUPPORTED_RATES_HZ:
        raise RealtimeError("invalid_value", f"input audio must be PCM16 at {' or '.join(map(str, SUPPORTED_RATES_HZ))} "
                            f"Hz; got {rate}", "session.input_audio_format.rate")
    return rate


class Conversation:
    """The connection's items, in order. Response output items join as they are added.

    Truncation leaves the oldest turns out of the model's context (`start`: the first item in it); they
    stay in the conversation, as in OpenAI's Realtime API."""

    def __init__(self):
        self.items: list[Item] = []
        self.start = 0

    @property
    def in_context(self) -> list[Item]:
        return self.items[self.start:]

    def leave_out_oldest_turn(self) -> bool:
        """Move the context's start past its oldest turn: up to the next user message, so that a call and
        its output leave together. False when the context holds no item."""
        if self.start >= len(self.items):
            return False
        self.start = next((i for i in range(self.start + 1, len(self.items)) if _is_user_message(self.items[i])),
                          len(self.items))
        return True

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` ("root": first; None: last); return the id now before it."""
        item.id = item.id or new_id("item")
        item.object = "realtime.item"
        at = self._insert_at(previous_item_id)
        self.items.insert(at, item)
        if at < self.start:  # among the turns truncation left out
            self.start += 1
        return self.items[at - 1].id if at else None

    def find(self, item_id: str) -> Item | None:
        return next((item for item in self.items if item.id == item_id), None)

    def replace(self, item: Item, new: Item) -> None:
        """`new` takes `item`'s place (events already made with `item` keep showing it as it was)."""
        self.items[self.items.index(item)] = new

    def delete(self, item: Item) -> None:
        at = self.items.index(item)
        del self.items[at]
        if at < self.start:
            self.start -= 1

    def _insert_at(self, previous_item_id: str | None) -> int:
        if previous_item_id is None:
            return len(self.items)
        if previous_item_id == "root":
            return 0
        for i, item in enumerate(self.items):
            if item.id == previous_item_id:
                return i + 1
        raise RealtimeError("item_not_found", f"no conversation item {previous_item_id!r}", "previous_item_id")

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def messages(self, instructions: str, content=None) -> list[dict]:
        """The items as chat messages: consecutive function calls join one assistant message. `content`
        renders a message's content (default: its text; see video for pictures and frames)."""
        content = content or item_text
        out = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.in_context:
            if item.type == "message" and _heard_nothing(item):
                continue  # a committed turn of silence: an item in the conversation, nothing for the model
            if item.type == "message":
                out.append({"role": item.role, "content": content(item)})
            elif item.type == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
            else:
                if not out or out[-1]["role"] != "assistant":
                    out.append({"role": "assistant", "content": ""})
                out[-1].setdefault("tool_calls", []).append(_tool_call(item))
        return out


def _heard_nothing(item: Item) -> bool:
    parts = item.content or []
    return bool(parts) and all(p.type == "input_audio" and not p.transcript for p in parts)


def _is_user_message(item: Item) -> bool:
    return item.type == "message" and item.role == "user"


def _tool_call(item: Item) -> dict:
    try:
        arguments = json.loads(item.arguments or "{}")
    except (json.JSONDecodeError, RecursionError):
        arguments = item.arguments
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}


def item_text(item: Item) -> str:
    """A message's text; an input_audio part reads as its transcript."""
    return "\n".join(part.text if part.text is not None else part.transcript or "" for part in item.content or [])


def user_text_item(text: str) -> Item:
    return Item(type="message", role="user", status="completed", content=[ContentPart("input_text", text)])


def check_client_item(item: Item, hears: bool = False, sees: bool = False) -> Item:
    """A conversation.item.create item rill can render, marked completed. `hears`: a speech model is
    served, so a user message may hold input_audio parts (transcribed before the item joins); `sees`:
    the model reads pictures, so it may hold input_image parts (processed before it joins)."""
    if item.type == "message":
        _check_message(item, hears, sees)
    elif item.type == "function_call":
        _require(item, ("call_id", "name", "arguments"))
    else:
        _require(item, ("call_id", "output"))
    item.status = "completed"
    return item


def _check_message(item: Item, hears: bool, sees: bool = False) -> None:
    if item.role is None or item.content is None:
        raise RealtimeError("missing_required_parameter", "a message item needs `role` and `content`",
                            "item.role" if item.role is None else "item.content")
    for i, part in enumerate(item.content):
        if part.type == "input_image" and item.role == "user":
            _check_image_part(part, sees, f"item.content[{i}]")
            continue
        if part.type == "input_audio" and hears and item.role == "user":
            if not part.audio:
                raise RealtimeError("missing_required_parameter", "an input_audio part needs `audio` (base64 PCM16)",
                                    f"item.content[{i}].audio")
            continue
        if part.type == "input_audio":
            raise RealtimeError("audio_not_supported", "this model has no audio front end and this server serves no "
                                "speech model: send input_text parts", f"item.content[{i}].type")
        if part.type not in _TEXT_PARTS[item.role] or part.text is None:
            raise RealtimeError("invalid_value", f"a {item.role} message holds {' or '.join(_TEXT_PARTS[item.role])} "
                                f"parts with `text`; got {part.type!r}", f"item.content[{i}]")


def _check_image_part(part, sees: bool, param: str) -> None:
    if not sees:
        raise RealtimeError("unsupported_modality", "this model reads text only: send input_text parts",
                            f"{param}.type")
    if not part.image_url:
        raise RealtimeError("missing_required_parameter", "an input_image part needs `image_url` (a data:image URL)",
                            f"{param}.image_url")


def _require(item: Item, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(item, name) is None:
            raise RealtimeError("missing_required_parameter", f"a {item.type} item needs `{name}`", f"item.{name}")
