"""Speech out in a realtime connection: a spoken response's text goes to the voice as the model
writes it, and each clause's audio comes back out right behind its transcript; and what the user
heard of each spoken answer, so that the conversation keeps only that.

    ResponseStream(speak=feed) -> SpeechOutLink.feed -> clauses -> the speech-out worker
    ClauseSpoken    -> response.output_audio_transcript.delta, then response.output_audio.delta pieces
    SpeechOutEnded  -> the response ends (after the engine's last delta it waits for its voice)
    conversation.item.truncate (audio_end_ms), or at a barge-in the server's own estimate (the audio
    sent, played at real-time pace from its first byte) -> the item's transcript, and so the next
    prompt, cut to the words heard by then (audio_output.Timeline)

Sans-IO like the connection it belongs to: the link's calls return at once, its events come back
through `on_event`; `clock` is trio's unless a test gives another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec
import trio

from rill.transports.realtime.audio_output import Timeline, WireAudio
from rill.transports.realtime.events import ErrorDetail, Item, RealtimeError, ResponseOptions, StatusDetails
from rill.transports.realtime.response import ResponseStream
from rill.transports.realtime.speech_out_events import ConversationItemTruncated
from rill.transports.realtime.speech_out_link import ClauseSpoken, SpeechOutEnded
from rill.transports.realtime.voice_out_settings import OPENAI_VOICES, wants_audio

AUDIO_PARTS = ("output_audio", "audio")


@dataclass
class _Heard:
    """A spoken answer's clauses in time, and when its first audio went out (None: none did)."""

    timeline: Timeline = field(default_factory=Timeline)
    first_audio_s: float | None = None


class _Answer:
    def __init__(self, response: ResponseStream, wire: WireAudio):
        self.response, self.wire = response, wire
        self.heard = _Heard()
        self.started = False  # the link has it (its first text came)
        self.status: tuple[str, StatusDetails | None] | None = None  # the engine's end: waiting for the voice


class SpokenOutput:
    def __init__(self, conn, link, clock=trio.current_time):
        self.conn, self.link, self.clock = conn, link, clock
        self._answer: _Answer | None = None  # the spoken response in progress
        self._heard: dict[str, _Heard] = {}  # spoken assistant item id -> its timeline
        self._last: str | None = None  # the latest spoken item, until a truncate or barge-in settles it

    @property
    def speaks(self) -> bool:
        return self.link is not None

    @property
    def resolve_voice(self):
        return self.link.resolve_voice if self.link is not None else None

    def wants_audio(self, options: ResponseOptions | None) -> bool:
        asked = self.conn.settings.voice_out.audio
        if options is not None and (options.output_modalities or options.modalities) is not None:
            asked = wants_audio(options.output_modalities or options.modalities, "response.output_modalities")
        return asked and self.speaks

    # -- a spoken response --------------------------------------------------------------------------------

    def begin(self, response: ResponseStream) -> None:
        self._answer = _Answer(response, WireAudio(self.conn.settings.voice_out.format, self.link.sample_rate))

    def feed(self, text: str) -> None:
        """The message's text as the engine writes it (ResponseStream's `speak`)."""
        answer = self._answer
        if answer is None:
            return  # text the tool-call parser let go as a stopped answer ends: never spoken, never in its transcript
        if not answer.started:
            voice = self.conn.settings.voice_out
            self.link.start(answer.response.id, self._voice_id(voice.voice), voice.speed)
            answer.started = True
        self.link.feed(answer.response.id, text)

    def _voice_id(self, name: str) -> str:
        """The backend's id for the session's voice (checked at session.update); an OpenAI name the backend
        lacks (a Kokoro directory's voices are its own) reads as the backend's default voice."""
        from rill.tts.backend import UnknownVoice
        from rill.tts.synthesizer import default_voice

        try:
            return self.link.resolve_voice(name)
        except UnknownVoice:
            if name not in OPENAI_VOICES:
                raise
            return self.link.resolve_voice(default_voice(self.link.backend))

    def text_done(self, status: str, details: StatusDetails | None) -> bool:
        """The engine's last delta: True when the response waits for its voice to finish."""
        answer = self._answer
        if answer is None or not answer.started:
            return False
        answer.status = (status, details)
        self.link.finish(answer.response.id)
        return True

    def on_event(self, event) -> None:
        answer = self._answer
        if answer is None or event.key != answer.response.id:
            return  # the rest of an answer already ended
        if isinstance(event, ClauseSpoken):
            self._clause(answer, event)
        elif isinstance(event, SpeechOutEnded):
            status = answer.status
            if event.error is not None:
                failure = ErrorDetail("server_error", "speech_out_failed", f"the voice failed: {event.error}")
                status = ("failed", StatusDetails("failed", error=failure))
            self.conn.end_response(*status)

    def _clause(self, answer: _Answer, event: ClauseSpoken) -> None:
        heard = answer.heard
        piece = (" " if heard.timeline.spans else "") + event.text
        heard.timeline.add(piece, 1000 * len(event.samples) / self.link.sample_rate)
        audio = answer.wire.pieces(event.samples)
        if heard.first_audio_s is None and audio:
            heard.first_audio_s = self.clock()
        for out in answer.response.spoken(piece, audio):
            self.conn.emit(out)

    def end(self) -> None:
        """The response ends (all spoken, cancelled or interrupted): the voice stops, the resampler's
        tail goes out, and the message's timeline is kept for truncation."""
        answer, self._answer = self._answer, None
        if answer is None:
            return
        if answer.started:
            self.link.cancel(answer.response.id)
            message = answer.response.message
            for out in answer.response.spoken("", answer.wire.pieces([], last=True)):
                self.conn.emit(out)
            self._heard[message.id] = answer.heard
            self._last = message.id

    # -- what was heard -----------------------------------------------------------------------------------

    def owns(self, item: Item) -> bool:
        """Whether `item` is the message of the spoken response in progress."""
        return self._answer is not None and self._answer.response.message is item

    def barge_in(self) -> None:
        """The user spoke over the latest answer: unless the client says what it played (truncate), the
        server takes it that the audio played at real-time pace from its first byte until now."""
        item_id, self._last = self._last, None
        heard = self._heard.get(item_id)
        if heard is None or heard.first_audio_s is None:
            return
        played_ms = 1000 * (self.clock() - heard.first_audio_s)
        if played_ms < heard.timeline.total_ms:
            self.truncate(self.conn.conversation.find(item_id), 0, int(played_ms))

    def truncate(self, item: Item | None, content_index: int, audio_end_ms: int) -> None:
        """conversation.item.truncate on a spoken assistant message (as OpenAI's: an error past its audio)."""
        heard = self._heard.get(item.id) if item is not None else None
        parts = (item.content or []) if item is not None else []
        if heard is None or not 0 <= content_index < len(parts) or parts[content_index].type not in AUDIO_PARTS:
            raise RealtimeError("invalid_value", f"item {getattr(item, 'id', None)!r} has no audio at content_index "
                                f"{content_index}: only a spoken answer's output_audio part can be truncated",
                                "content_index")
        total_ms = math.ceil(heard.timeline.total_ms)
        if not 0 <= audio_end_ms <= total_ms:
            raise RealtimeError("invalid_value", f"audio_end_ms must be between 0 and the item's audio duration, "
                                f"{total_ms} ms; got {audio_end_ms}", "audio_end_ms")
        cut = msgspec.structs.replace(parts[content_index], transcript=heard.timeline.text_at(audio_end_ms))
        self.conn.conversation.replace(item, msgspec.structs.replace(item, content=[
            cut if i == content_index else part for i, part in enumerate(parts)]))
        if self._last == item.id:
            self._last = None  # the client said what it played: no estimate at the next barge-in
        self.conn.emit(ConversationItemTruncated(item_id=item.id, content_index=content_index,
                                                 audio_end_ms=audio_end_ms))

    def forget(self, item_id: str) -> None:
        self._heard.pop(item_id, None)
        if self._last == item_id:
            self._last = None
