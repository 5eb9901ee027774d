"""RealtimeConnection: the realtime protocol, sans-IO. Client frames and engine deltas in, server
events out; engine commands go through a small `EngineLink` (non-blocking calls). No socket
here: `driver` pumps a WebSocket through it, and tests drive it with the real engine.

A connection is in one `State` at a time, changed only through `TRANSITIONS`:

    IDLE --text append--> STREAMING --text commit--> COMMITTED --response.create--> RESPONDING
    IDLE --response.create--> RESPONDING --done / cancel--> IDLE

STREAMING means an engine session is open and prefills the user's text as it arrives, over the
conversation so far. In `respond_per_chunk` mode (vLLM's) the session answers every chunk: its
answers are out-of-band responses (STREAMING <-> ANSWERING); a chunk that arrives mid-answer
ends that answer (status cancelled, reason turn_detected) and the generated tokens stay in the
context; commit closes the message and the answer to all of it is the in-band response.
In `respond_at_end` mode text that arrives while a response generates waits for it to end.
"""

from __future__ import annotations

from typing import Protocol

from rill.openai.serving import Serving
from rill.outputs import RequestDelta
from rill.sampling_params import SamplingParams
from rill.tokenizer import IncrementalEncoder
from rill.transports.realtime.audio_input import (
    OPENAI_RATE_HZ, VLLM_RATE_HZ, AudioInput, AudioLimits, audio_front_end,
)
from rill.transports.realtime.conversation import (
    Conversation, Settings, as_realtime_error, check_client_item, user_text_item,
)
from rill.transports.realtime.events import (
    ClientEvent, ConversationItemCreate, ConversationItemDelete, ConversationItemDeleted, ConversationItemRetrieve,
    ConversationItemRetrieved, ConversationItemTruncate, InputAudioBufferAppend, InputAudioBufferClear,
    InputAudioBufferCommit, InputTextBufferAppend, InputTextBufferCommit, InputVideoFrameAppend, InputVideoFrameCommit,
    InputAudioBufferCommitted, InputTextBufferCommitted, Item, RealtimeError, ResponseCancel, ResponseCreate,
    NOT_APPLIED, ResponseOptions, RetentionRatio, ServerEvent, SessionConfig, SessionCreated, SessionUpdate,
    SessionUpdated, StatusDetails, decode_client_event, error_event, new_id,
)
from rill.transports.realtime import model_switch
from rill.transports.realtime.model_switch import ServingFor
from rill.transports.realtime.text_input import InputTurn, split_prompt
from rill.transports.realtime.spoken import SpokenOutput
from rill.transports.realtime.voice import SpeechLink, VoiceInput
from rill.transports.realtime.video import VideoInput
from rill.transports.realtime.response import Dialect, ResponseStream, end_status
from rill.transports.realtime.state import TRANSITIONS, Move, State

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
TURN_DETECTED = StatusDetails("cancelled", "turn_detected")


class EngineLink(Protocol):
    """The engine calls a connection makes; each returns at once (see AsyncEngine)."""

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, mm_items=()) -> None: ...
    def open_session(self, request_id: str, params: SamplingParams, *, respond_per_chunk: bool,
                     prompt_token_ids: list[int], mm_items=()) -> None: ...
    def append(self, request_id: str, token_ids: list[int], mm_items=()) -> None: ...
    def finish(self, request_id: str, max_tokens: int | None) -> None: ...
    def abort(self, request_id: str) -> None: ...


class RealtimeConnection:
    def __init__(self, serving: Serving, engine: EngineLink, *, dialect: Dialect = Dialect.GA,
                 model: str | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 audio_limits: AudioLimits | None = None, speech: SpeechLink | None = None, video=None,
                 serving_for: ServingFor | None = None, audio_rate_hz: int = OPENAI_RATE_HZ, speech_out=None):
        self.serving, self.engine, self.dialect = serving, engine, dialect
        self.serving_for = serving_for  # another served model by name (session.update; see model_switch)
        self.max_message_bytes = max_message_bytes
        self.state = State.IDLE
        self.session_id, self.conversation_id = new_id("sess"), new_id("conv")
        self.settings = Settings(model=serving.check_model(model), audio_rate_hz=audio_rate_hz)
        self.speaks_vllm = False  # opened vLLM's way: its transcription.* events, 16 kHz unless named
        self.conversation = Conversation()
        self.audio = AudioInput(speech if speech is not None else audio_front_end(serving.engine.core.model_config),
                                audio_limits)
        self.voice = VoiceInput(self, speech)  # speech in: the audio buffer and the recogniser's events
        self._speech_models = (speech.model_name,) if speech is not None else ()
        self._audio_item: Item | None = None  # the next committed user message is this audio item
        self.voice.reconfigure()
        self.spoken = SpokenOutput(self, speech_out)  # speech out: spoken answers (speech_out: its SpeechOutLink)
        self.settings.speaks = self.spoken.speaks
        self.video = VideoInput(self, video)  # frames and pictures in (video: its VideoLink)
        self.num_requests = 0
        self._turn: InputTurn | None = None
        self._response: ResponseStream | None = None
        self._request_id: str | None = None  # the engine request whose deltas this connection reads
        self._answer_prompt_tokens = 0  # respond_per_chunk: the latest answer's prompt length
        self._pending: list[str] = []  # respond_at_end: text that arrived during a response
        self._pending_commit = False
        self._speak_next: bool | None = None  # response.create's output_modalities (None: the session's)
        self._out: list[ServerEvent] = []

    @property
    def is_busy(self) -> bool:
        """Whether output is being generated (an idle timeout waits for it)."""
        return self.state in (State.RESPONDING, State.ANSWERING)

    # -- events in, events out ----------------------------------------------------------------------------

    def start(self) -> list[ServerEvent]:
        return [SessionCreated(session=self.settings.wire(self.session_id, self.dialect is Dialect.GA))]

    def receive_message(self, data: str | bytes) -> list[ServerEvent]:
        """One client frame."""
        event_id = None
        try:
            event = self._decode(data)
            event_id = event.event_id
            if not self.video.holds(event):  # events that change the prompt wait behind frames on their way
                self._dispatch(event)
        except Exception as exc:  # noqa: BLE001 - rill's own errors become error events; others propagate
            self._report(exc, event_id)
        return self._take()

    def receive_video(self, event) -> list[ServerEvent]:
        """One event of the connection's frame feed or picture decoding (see video_link)."""
        try:
            self.video.on_event(event)
        except Exception as exc:  # noqa: BLE001 - as in receive_message
            self._report(exc, None)
        return self._take()

    def replay(self, event) -> None:
        """An event that waited (see video.holds), in its turn: a client event or a recogniser's."""
        try:
            if not self.video.holds(event):
                self._dispatch(event) if isinstance(event, ClientEvent) else self.voice.on_event(event)
        except Exception as exc:  # noqa: BLE001 - as in receive_message
            self._report(exc, getattr(event, "event_id", None))

    def add_client_item(self, item: Item, previous_item_id: str | None) -> None:
        """A checked client item joins the conversation (after its audio is transcribed, if it had any)."""
        previous = self.conversation.add(item, previous_item_id)
        self.item_added(item, previous)
        self._input_changed()

    def item_added(self, item: Item, previous_item_id: str | None) -> None:
        """Announce a complete item that joined the conversation, in the client's dialect."""
        self._out += self.dialect.item_added(item, previous_item_id)

    # The seam for input modules (voice): emit, has_streamed_input, commit_spoken_text and the
    # public verbs below (append_text, commit_text, drop_input, create_response, interrupt).

    def emit(self, event: ServerEvent) -> None:
        """Queue a server event: it goes out with the events of the call being handled."""
        self._out.append(event)

    @property
    def has_streamed_input(self) -> bool:
        """The user turn's words went through the streamed-text path (or wait, behind a response, to)."""
        return self.state in (State.STREAMING, State.ANSWERING) or (self.state is State.RESPONDING
                                                                     and bool(self._pending))

    def commit_spoken_text(self, item: Item) -> None:
        """Commit the streamed words as the transcript of `item`, an input_audio message (see voice)."""
        self._audio_item = item
        self.commit_text()

    def receive_speech(self, event) -> list[ServerEvent]:
        """One event of the connection's recogniser (rill.speech.live.LiveEvent) or of an item's transcription."""
        try:
            if not self.video.holds(event):  # recognised words join the prompt after the frames before them
                self.voice.on_event(event)
        except Exception as exc:  # noqa: BLE001 - as in receive_message
            self._report(exc, None)
        return self._take()

    def receive_speech_out(self, event) -> list[ServerEvent]:
        """One event of the voice speaking this connection's answer (speech_out_link)."""
        try:
            self.spoken.on_event(event)
        except Exception as exc:  # noqa: BLE001 - as in receive_message
            self._report(exc, None)
        return self._take()

    def receive_delta(self, delta: RequestDelta) -> list[ServerEvent]:
        """One engine delta for a request this connection made."""
        if delta.request_id != self._request_id:
            return []  # the last words of a request already aborted
        if delta.error is not None:
            self._engine_failed(delta)
        elif self.state is State.RESPONDING:
            self._response_delta(delta)
        elif self._turn is not None and self._turn.per_chunk:
            self._answer_delta(delta)
        return self._take()

    def close(self) -> None:
        """The client left: abort what runs (its KV is free by the engine's next step)."""
        if self._request_id is not None:
            self.engine.abort(self._request_id)
            self._request_id = None

    def _report(self, exc: Exception, event_id: str | None) -> None:
        error = as_realtime_error(exc)
        self._out.append(error_event(error, error.event_id or event_id))

    def _take(self) -> list[ServerEvent]:
        out, self._out = self._out, []
        return out

    def _move(self, move: Move) -> None:
        self.state = TRANSITIONS[(self.state, move)]

    def _decode(self, data: str | bytes):
        if isinstance(data, bytes):
            raise RealtimeError("binary_not_supported", "send events as JSON text frames; this protocol has no "
                                "binary frames (audio goes base64 in input_audio_buffer.append)")
        size = len(data.encode())
        if size > self.max_message_bytes:
            raise RealtimeError("message_too_large", f"an event is at most {self.max_message_bytes} bytes; this "
                                f"one has {size}: split it (several appends)")
        return decode_client_event(data)

    def _dispatch(self, event) -> None:
        match event:
            case SessionUpdate():
                self._session_update(event)
            case InputTextBufferAppend():
                self.append_text(event.delta)
            case InputTextBufferCommit():
                self.commit_text()
            case ConversationItemCreate():
                self._item_create(event)
            case ResponseCreate():
                if not self.voice.defer_response(event.response):
                    self.create_response(event.response)
            case ResponseCancel():
                self._response_cancel(event.response_id)
            case InputAudioBufferAppend():
                self.voice.append(event.audio)
            case InputAudioBufferCommit():
                self.voice.commit(event.final)
            case InputAudioBufferClear():
                self.voice.clear()
            case InputVideoFrameAppend():
                self.video.append_frame(event)
            case InputVideoFrameCommit():
                self.video.commit(event)
            case ConversationItemRetrieve():
                self._out.append(ConversationItemRetrieved(item=self._find_item(event.item_id)))
            case ConversationItemDelete():
                self._item_delete(event.item_id)
            case ConversationItemTruncate():
                self._item_truncate(event)

    # -- session and conversation ---------------------------------------------------------------------------

    def _session_update(self, event: SessionUpdate) -> None:
        try:
            self._apply_session_update(event)
        except Exception as exc:  # noqa: BLE001 - the error says the update was refused whole
            error = as_realtime_error(exc)
            error.message += NOT_APPLIED
            raise error from exc

    def _apply_session_update(self, event: SessionUpdate) -> None:
        config = event.session or SessionConfig()
        config.model = config.model or event.model
        serving = model_switch.serving_named(self, config.model, self._speech_models)
        before, heard, saved = self._prompt_shape(), self.voice.live_config(), dict(self.settings.__dict__)
        self.settings.update(config, serving, self._speech_models, self.spoken.resolve_voice)
        if self.voice.live_config() != heard:
            try:
                self.voice.reconfigure()  # checks the transcription settings against the speech model
            except Exception:
                self.settings.__dict__.update(saved)  # a refused update changes nothing
                raise
        if event.session is None and event.model is not None:  # vLLM's shape: the model at the top level
            self.speaks_vllm = True
            if not self.settings.rate_named:
                self.settings.audio_rate_hz = VLLM_RATE_HZ  # what vLLM's clients send, unnamed
        if serving is not self.serving:
            model_switch.use(self, serving)
        self._out.append(SessionUpdated(session=self.settings.wire(self.session_id, self.dialect is Dialect.GA)))
        if self._prompt_shape() != before:
            self._input_changed()

    def _prompt_shape(self):
        s = self.settings
        return s.instructions, s.template_tools, s.tool_prefix, s.temperature

    def _item_create(self, event: ConversationItemCreate) -> None:
        item = check_client_item(event.item, hears=self.voice.link is not None, sees=self.video.sees)
        if self.voice.transcribe_item(item, event.previous_item_id):
            return  # joins the conversation once its audio is transcribed (VoiceInput._item_heard)
        if self.video.decode_item(item, event.previous_item_id, event.event_id):
            return  # joins once its pictures are processed (VideoInput._images_decoded)
        if self.video.joins(item, event.previous_item_id):
            return  # the question about what the camera showed: it ends the message the frames are in
        self.add_client_item(item, event.previous_item_id)

    def _find_item(self, item_id: str) -> Item:
        item = self.conversation.find(item_id)
        if item is None:
            raise RealtimeError("item_not_found", f"the conversation has no item {item_id!r}", "item_id")
        return item

    def _item_delete(self, item_id: str) -> None:
        item = self._find_item(item_id)
        if self._response is not None and any(out is item for out in self._response.response.output):
            raise RealtimeError("item_in_response", f"item {item_id!r} belongs to the response in progress; cancel "
                                "it first", "item_id")
        self.conversation.delete(item)
        self.spoken.forget(item_id)
        self._out.append(ConversationItemDeleted(item_id=item_id))
        self._input_changed()

    def _item_truncate(self, event: ConversationItemTruncate) -> None:
        item = self._find_item(event.item_id)
        if item.role != "assistant":
            raise RealtimeError("invalid_value", "only an assistant message can be truncated", "item_id")
        if self.spoken.owns(item):  # the answer still speaking: the user heard this much, so it stops here
            self.engine.abort(self._request_id)
            self._end_response("cancelled", StatusDetails("cancelled", "client_cancelled"))
        self.spoken.truncate(item, event.content_index, event.audio_end_ms)
        self._input_changed()  # an open turn's prompt holds the words cut

    def _input_changed(self) -> None:
        """The conversation or the prompt's shape changed under an open input session."""
        if self.state is State.COMMITTED:
            self.drop_input()  # its message is in the conversation; response.create renders it anew
        elif self.state in (State.STREAMING, State.ANSWERING) and not self.video.reopens():
            text = self._turn.text
            self.drop_input()
            self._open_input(text)

    # -- streamed text input ------------------------------------------------------------------------------------

    def append_text(self, text: str) -> None:
        """Words of the user turn, typed (input_text_buffer.append) or recognised: prefilled as they come."""
        if not text:
            return
        if self.state is State.RESPONDING:
            if not self.video.behind_frames(text):  # after frames waiting for the next message: behind them
                self._pending.append(text)
            return
        if self.state is State.COMMITTED:
            self.drop_input()
        if self.state is State.ANSWERING:
            self._end_answer("cancelled", TURN_DETECTED)
        if self.state is State.IDLE:
            self._open_input(text)
        else:
            self._feed(text)

    def _open_input(self, text: str) -> None:
        tokenizer, settings = self.serving.tokenizer, self.settings
        messages = self.conversation.messages(settings.instructions, self.video.content)
        split = split_prompt(tokenizer, messages, settings.template_tools)
        per_chunk = settings.output_mode == "respond_per_chunk"
        forced = settings.forced(tokenizer)
        turn = InputTurn(self._new_request_id(), IncrementalEncoder(tokenizer), split.suffix + forced.prompt_text,
                         per_chunk, text)
        ids, items = self.video.open_turn(turn, turn.encoder.feed(split.prefix))  # pictures and videos placed
        text_ids = self._encode(turn, text)
        self.video.on_sent(turn, text_ids)
        self.video.on_text(turn, text)
        ids += text_ids
        if not self._fits(turn):
            if self._truncate():
                return self._open_input(text)  # over what is left of the conversation
            raise self._too_long(turn)
        params = settings.sampling_params(self.serving)
        params.max_tokens = settings.max_output_tokens if per_chunk else None  # respond_at_end: set at finish
        self.engine.open_session(turn.request_id, params, respond_per_chunk=per_chunk, prompt_token_ids=ids,
                                 mm_items=items)
        self._turn, self._request_id, self._answer_prompt_tokens = turn, turn.request_id, 0
        self._move(Move.OPEN_INPUT)
        self.video.on_turn_opened(turn)

    # The seam for video: the open turn, opening one, and sending to it (its context mirrors what is sent).

    @property
    def turn(self) -> InputTurn | None:
        return self._turn

    def open_input(self, text: str) -> None:
        self._open_input(text)

    def send(self, turn: InputTurn, ids: list[int]) -> None:
        if ids:
            self.engine.append(turn.request_id, ids)
            self.video.on_sent(turn, ids)

    def _feed(self, text: str) -> None:
        turn = self._turn
        turn.text += text
        self.video.before_text(turn)  # an open video ends where text starts
        self.video.on_text(turn, text)
        ids = self._encode(turn, text)
        if not self._fits(turn):
            self._reopen(turn)  # the whole message so far, over what is left of the conversation
            return
        self.send(turn, ids)

    def _encode(self, turn: InputTurn, text: str) -> list[int]:
        # A chunk the model answers at once must be seen whole; otherwise wait for stable tokens.
        return turn.encoder.flush(text) if turn.per_chunk else turn.encoder.feed(text)

    def _fits(self, turn: InputTurn, room: int = 1) -> bool:
        return turn.num_tokens + room <= self.serving.max_model_len

    def _reopen(self, turn: InputTurn) -> InputTurn:
        """The streaming message does not fit: drop it, truncate the conversation, open it again from its
        text; context_length_exceeded (the message dropped) when truncation cannot make room."""
        self.drop_input()
        if not _text_only(turn) or not self._truncate():
            raise self._too_long(turn)
        self._open_input(turn.text)
        return self._turn

    def _reopen_truncated(self, turn: InputTurn, room: int) -> tuple[InputTurn, list[int]]:
        """The message ends, and with its last tokens and `room` for the answer it does not fit: open it
        again over a truncated conversation; returns the new turn and its last ids (not yet sent)."""
        while True:
            turn = self._reopen(turn)
            tail = turn.encoder.flush(turn.suffix)
            if self._fits(turn, room):
                return turn, tail

    def _too_long(self, turn: InputTurn) -> RealtimeError:
        return RealtimeError("context_length_exceeded", f"the streamed message reaches {turn.num_tokens} tokens "
                             f"with the conversation; this model's maximum context length is "
                             f"{self.serving.max_model_len}. The message was dropped", "delta")

    def _truncate(self) -> bool:
        """session.truncation: leave the conversation's oldest turns out of the context (they stay in the
        conversation), one turn ("auto") or down to retention_ratio of its tokens. False when truncation is
        disabled or the context holds no item. A streaming message that holds video of its own is not
        re-opened (its frames would be lost): it gets context_length_exceeded as before."""
        truncation = self.settings.truncation
        before = self._context_tokens() if isinstance(truncation, RetentionRatio) else 0
        if truncation == "disabled" or not self.conversation.leave_out_oldest_turn():
            return False
        if isinstance(truncation, RetentionRatio):
            while self._context_tokens() > truncation.retention_ratio * before:
                if not self.conversation.leave_out_oldest_turn():
                    break
        return True

    def _context_tokens(self) -> int:
        """The conversation's tokens in the context, without the instructions."""
        messages = self.conversation.messages("", self.video.content)
        if not messages:
            return 0
        text = self.serving.tokenizer.apply_chat_template(messages, tools=self.settings.template_tools)
        return len(self.serving.tokenizer.encode(text, add_special_tokens=False))

    def commit_text(self, options: ResponseOptions | None = None) -> None:
        """The streamed words become a user message (after the response in flight, if one is)."""
        if self.state is State.RESPONDING and self.video.behind_frames("", commit=True):
            return
        if self.state is State.RESPONDING and self._pending:
            self._pending_commit = True
            return
        if self.state not in (State.STREAMING, State.ANSWERING):
            raise RealtimeError("input_text_buffer_commit_empty", "there is no streamed text to commit")
        room = self.settings.max_tokens(options) or 1  # the answer's, so that it can start (checked before a change)
        if self.state is State.ANSWERING:
            self._end_answer("cancelled", TURN_DETECTED)
        turn = self._turn
        self.video.before_text(turn)  # the message ends: so does its video
        tail = turn.encoder.flush(turn.suffix)
        if not self._fits(turn, room) and room < self.serving.max_model_len:
            turn, tail = self._reopen_truncated(turn, room)
        self._add_user_item(committed=True)
        self.send(turn, tail)
        self.video.on_turn_closed()
        if turn.per_chunk:
            self._finish_input(self.settings.max_tokens(options))  # the whole message is answered now
        else:
            self._move(Move.COMMIT_INPUT)

    def drop_input(self) -> None:
        """Abort the open input session; its words leave the prompt."""
        if self.state is State.ANSWERING:
            self._end_answer("cancelled", StatusDetails("cancelled", "client_cancelled"))
        self.engine.abort(self._turn.request_id)
        self._turn = self._request_id = None
        self._move(Move.DROP_INPUT)
        self.video.on_turn_closed()

    # -- responses ------------------------------------------------------------------------------------------------

    def create_response(self, options: ResponseOptions | None) -> None:
        """response.create: answer the committed (or still streaming) turn, or the conversation."""
        if self.state is State.RESPONDING:
            raise RealtimeError("conversation_already_has_active_response", f"response {self._response.id} is "
                                "still in progress; cancel it or wait for response.done")
        self._speak_next = self.spoken.wants_audio(options)  # checks output_modalities before anything starts
        if self.state in (State.STREAMING, State.ANSWERING):
            self.commit_text(options)
            if self.state is State.RESPONDING:
                return
        overrides = options is not None and (options.instructions is not None or options.temperature is not None)
        if self.state is State.COMMITTED and overrides:
            self.drop_input()  # another system prompt or sampler than the session was opened with
        if self.state is State.COMMITTED:
            self._finish_input(self.settings.max_tokens(options))
        else:
            self._submit(options)

    def _finish_input(self, max_tokens: int | None) -> None:
        turn = self._turn
        self.serving.check_fits(turn.num_tokens, max_tokens, "max_output_tokens")
        self.engine.finish(turn.request_id, max_tokens)
        self._start_response(turn.request_id, max_tokens)

    def _submit(self, options: ResponseOptions | None) -> None:
        instructions = self.settings.instructions
        if options is not None and options.instructions is not None:
            instructions = options.instructions
        params = self.settings.sampling_params(self.serving, options)
        prompt, items = self._conversation_prompt(instructions)
        room, limit = params.max_tokens or 1, self.serving.max_model_len  # the answer's room
        while room < limit < len(prompt) + room and self._truncate():  # room past the limit: no cut helps
            prompt, items = self._conversation_prompt(instructions)
        self.serving.check_fits(len(prompt), params.max_tokens, "conversation")
        self.serving.check_ready()
        request_id = self._new_request_id()
        self.engine.submit(request_id, prompt, params, items)
        self._start_response(request_id, params.max_tokens)

    def _conversation_prompt(self, instructions: str) -> tuple[list[int], list]:
        messages = self.conversation.messages(instructions, self.video.content)
        if not messages:
            raise RealtimeError("conversation_empty", "there is nothing to answer: create an item or stream text "
                                "(input_text_buffer.append) first")
        tokenizer = self.serving.tokenizer
        text = tokenizer.apply_chat_template(messages, tools=self.settings.template_tools)
        forced = self.settings.forced(tokenizer)
        prompt = tokenizer.encode(text + forced.prompt_text, add_special_tokens=False)
        return self.video.expand(prompt)  # pictures and videos of the conversation placed

    def _new_response(self, in_band: bool, max_tokens: int | None) -> ResponseStream:
        """An in-band response is spoken when the session (or response.create) asks for audio; respond_per_chunk's
        interim answers are text."""
        parse_tools = self.settings.template_tools is not None and self.serving.options.tool_call_parser is not None
        speak, self._speak_next = self._speak_next, None
        speak = in_band and (self.spoken.wants_audio(None) if speak is None else speak)
        response = ResponseStream(self.dialect, parse_tools=parse_tools, max_output_tokens=max_tokens,
                                  add_item=self.conversation.add if in_band else None,
                                  conversation_id=self.conversation_id if in_band else None,
                                  tool_prefix=self.settings.forced(self.serving.tokenizer).prompt_text if in_band
                                  else "", speak=self.spoken.feed if speak else None)
        if speak:
            self.spoken.begin(response)
        return response

    def _start_response(self, request_id: str, max_tokens: int | None) -> None:
        self._request_id = request_id
        self._response = self._new_response(True, max_tokens)
        self._out.append(self._response.created())
        self._move(Move.START_RESPONSE)

    def _response_delta(self, delta: RequestDelta) -> None:
        if delta.num_prompt_tokens < self._answer_prompt_tokens:
            return  # respond_per_chunk: the tail of an answer the final message interrupted
        self._out += self._response.on_delta(delta)
        if delta.finished:
            self._out += self._response.flush()
            if not self.spoken.text_done(*end_status(delta)):  # else: when its voice is done
                self._end_response(*end_status(delta))

    def end_response(self, status: str, details: StatusDetails | None = None) -> None:
        """A spoken response ends from its voice (spoken.SpokenOutput): all said after the engine's end, or the
        voice failed (then the model's request, which may still be writing, is aborted)."""
        self.engine.abort(self._request_id)
        self._end_response(status, details)

    def _end_response(self, status: str, details: StatusDetails | None = None) -> None:
        self.spoken.end()  # a voice still speaking stops; its last audio goes before the response's end
        self._out += self._response.finish(status, details)
        self._response = self._turn = self._request_id = None
        self._move(Move.END_RESPONSE)
        self._replay_pending()
        self.video.after_response()  # frames that waited open the next turn

    def _replay_pending(self) -> None:
        text, self._pending = "".join(self._pending), []
        commit, self._pending_commit = self._pending_commit, False
        try:
            if text:
                self._open_input(text)
            if commit:
                self.commit_text()
        except Exception as exc:  # noqa: BLE001 - as in receive_message
            self._report(exc, None)

    def interrupt(self) -> None:
        """Barge-in: the user speaks again, the answer in flight stops (its text so far stays)."""
        self.engine.abort(self._request_id)
        self._end_response("cancelled", TURN_DETECTED)

    def _response_cancel(self, response_id: str | None) -> None:
        if self._response is None or response_id not in (None, self._response.id):
            raise RealtimeError("response_cancel_not_active", "no response is in progress" if response_id is None
                                else f"response {response_id!r} is not in progress", "response_id")
        if self.state is State.ANSWERING:  # the session goes: what was typed so far stays in the conversation
            self._add_user_item(committed=False)
            self.drop_input()
            return
        self.engine.abort(self._request_id)
        self._end_response("cancelled", StatusDetails("cancelled", "client_cancelled"))

    def _add_user_item(self, committed: bool) -> None:
        """The streamed text so far becomes a user message item (an input_audio item when it was spoken)."""
        item, self._audio_item = self._audio_item, None
        if item is not None:
            item.content[0].transcript = self._turn.text
        item = self.video.user_item(self._turn, item) or item or user_text_item(self._turn.text)
        previous = self.conversation.add(item)
        if committed:
            spoken = any(part.type == "input_audio" for part in item.content)
            kind = InputAudioBufferCommitted if spoken else InputTextBufferCommitted
            self._out.append(kind(item_id=item.id, previous_item_id=previous))
        self.item_added(item, previous)

    # -- respond_per_chunk answers ------------------------------------------------------------------------------

    def _answer_delta(self, delta: RequestDelta) -> None:
        num_prompt = delta.num_prompt_tokens
        if num_prompt < self._answer_prompt_tokens or (self.state is State.STREAMING
                                                       and num_prompt == self._answer_prompt_tokens):
            return  # the tail of an interrupted answer
        if self.state is State.ANSWERING and num_prompt > self._answer_prompt_tokens:
            self._end_answer("cancelled", TURN_DETECTED)
        if self.state is State.STREAMING:
            self._answer_prompt_tokens = num_prompt
            self._response = self._new_response(False, self.settings.max_output_tokens)
            self._out.append(self._response.created())
            self._move(Move.START_ANSWER)
        self._out += self._response.on_delta(delta)
        if delta.turn_finish_reason is not None:
            self._end_answer(*end_status(delta))

    def _end_answer(self, status: str, details: StatusDetails | None = None) -> None:
        self._out += self._response.finish(status, details)
        self._response = None
        self._move(Move.END_ANSWER)

    def _engine_failed(self, delta: RequestDelta) -> None:
        if self.state is State.RESPONDING:
            self._end_response(*end_status(delta))
            return
        if self.state is State.ANSWERING:
            self._end_answer(*end_status(delta))
        self._turn = self._request_id = None
        self._move(Move.DROP_INPUT)
        self._out.append(error_event(RealtimeError("engine_error", delta.error, kind="server_error"), None))

    def _new_request_id(self) -> str:
        self.num_requests += 1
        return f"rt-{self.session_id}-{self.num_requests}"


def _text_only(turn: InputTurn) -> bool:
    """A streaming message that can be opened again from its text: no live video of its own."""
    return all(isinstance(part, str) for part in turn.parts)
