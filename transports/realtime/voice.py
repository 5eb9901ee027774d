"""Speech in a realtime connection: the audio buffer's client events, and the recogniser's events
(rill.speech.live) turned into protocol events and into the user's turn.

    input_audio_buffer.append  -> AudioInput (decode, resample, caps) -> SpeechLink.feed
    recogniser: SpeechStarted  -> input_audio_buffer.speech_started (+ barge-in: the answer in
                                  flight is cancelled, reason turn_detected, and a spoken answer
                                  still playing is cut to what was heard: spoken.barge_in)
                TranscriptDelta-> conversation.item.input_audio_transcription.delta, vLLM's
                                  transcription.delta, and in a realtime session the same words
                                  appended to the user turn through the streamed-text path, so
                                  they are prefilled while the user speaks
                SpeechStopped  -> input_audio_buffer.speech_stopped
                TranscriptDone -> input_audio_buffer.committed, conversation.item.created (an
                                  input_audio item holding the transcript), ...transcription.completed,
                                  and with server_vad's create_response the answer; for every turn,
                                  an empty transcript too (no answer then: the chat model reads words)
    input_audio_buffer.commit  -> the turn ends where the audio ends (final: true, vLLM's end of
                                  stream, also sends transcription.done with everything heard)

Sans-IO like the connection it belongs to: the link's calls return at once; its events come back
through `on_event`.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
import numpy as np

from rill.transports.realtime.audio_input import MODEL_RATE_HZ, decode_pcm16, resample
from rill.transports.realtime.conversation import item_text
from rill.transports.realtime.speech_link import ItemTranscribed
from rill.speech.live import (LiveConfig, LiveEvent, SpeechFailed, SpeechStarted, SpeechStopped, TranscriptDelta,
                              TranscriptDone)
from rill.transports.realtime.events import (
    ContentPart, ErrorDetail, InputAudioBufferCleared, InputAudioBufferCommitted, Item,
    RealtimeError, error_event, new_id,
)
from rill.transports.realtime.state import State
from rill.transports.realtime.voice_events import (
    InputTranscriptionCompleted, InputTranscriptionDelta, InputTranscriptionFailed, SpeechStartedEvent,
    SpeechStoppedEvent, TranscriptionDelta, TranscriptionDone, TranscriptUsage,
)


class SpeechLink(Protocol):
    """The recogniser of one connection (see driver.LiveSpeechLink); every call returns at once."""

    model_name: str

    def configure(self, config: LiveConfig) -> None: ...  # a new recogniser: audio not yet final is dropped
    def feed(self, samples_16k: np.ndarray, native: np.ndarray | None = None, rate_hz: int = 16_000) -> None: ...
    def commit(self, final: bool) -> None: ...
    def clear(self) -> None: ...
    input_rate: int  # the rate the speech model hears (16 kHz, or a causal model's own)

    def transcribe(self, item_id: str, samples: np.ndarray, config: LiveConfig,
                   rate_hz: int = MODEL_RATE_HZ) -> None: ...  # a whole recording


MIN_COMMIT_MS = 100  # as OpenAI's Realtime API: a shorter buffer cannot be committed
MIN_COMMIT_SAMPLES = MIN_COMMIT_MS * MODEL_RATE_HZ // 1000


def audio_item(item_id: str, transcript: str) -> Item:
    return Item(type="message", id=item_id, role="user", status="completed",
                content=[ContentPart("input_audio", transcript=transcript)])


class VoiceInput:
    """One connection's speech: `conn` is the RealtimeConnection whose turn the words join."""

    def __init__(self, conn, link: SpeechLink | None):
        self.conn, self.link = conn, link
        self.item_id: str | None = None  # the user item the current turn's audio becomes
        self.num_uncommitted_samples = 0
        self.num_pending_commits = 0  # commits (and audio items) whose transcript is not complete yet
        self._items: dict[str, tuple[Item, str | None]] = {}  # audio items waiting for their transcript
        self._deferred: list = []  # response.create options that wait for those transcripts
        self._heard: list[str] = []  # every turn's transcript, for vLLM's transcription.done

    @property
    def _transcribing_only(self) -> bool:
        return self.conn.settings.session_type == "transcription"

    def live_config(self) -> LiveConfig:
        settings = self.conn.settings
        return LiveConfig(turn_detection=settings.turn_detection, language=settings.transcription.language,
                          prompt=settings.transcription.prompt)

    def reconfigure(self) -> None:
        if self.link is not None:
            self.link.configure(self.live_config())

    # -- client events --------------------------------------------------------------------------------

    def append(self, audio_b64: str) -> None:
        before = self.conn.audio.num_samples_16k
        self.conn.audio.append(audio_b64, self.conn.settings.audio_rate_hz)
        self.num_uncommitted_samples += self.conn.audio.num_samples_16k - before

    def commit(self, final: bool) -> None:
        self._check_link()
        if not self.num_uncommitted_samples and not final and self._transcribing_only:
            return  # vLLM's clients commit once before any audio to start transcribing
        if self.num_uncommitted_samples < MIN_COMMIT_SAMPLES and not final:
            held_ms = 1000 * self.num_uncommitted_samples / MODEL_RATE_HZ
            raise RealtimeError("input_audio_buffer_commit_empty", f"buffer too small: a commit needs at least "
                                f"{MIN_COMMIT_MS} ms of audio; the input audio buffer holds {held_ms:.2f} ms since the "
                                "last commit")
        self.num_uncommitted_samples = 0
        self.num_pending_commits += 1
        self.item_id = self.item_id or new_id("item")
        self.conn.audio.commit()  # the resampler's held-back samples join the turn
        self.link.commit(final)

    def transcribe_item(self, item: Item, previous_item_id: str | None) -> bool:
        """A client item with input_audio parts: True when it waits for their transcript (then it joins
        the conversation, with `transcript` set and the audio dropped, from `_item_heard`)."""
        parts = [p for p in item.content or [] if p.type == "input_audio"]
        if not parts or self.link is None:
            return False
        rate_hz = self.conn.settings.audio_rate_hz
        samples = [decode_pcm16(p.audio, int(self.conn.audio.limits.max_event_s * rate_hz)) for p in parts]
        to_hz = self.link.input_rate if self.link.input_rate == rate_hz else MODEL_RATE_HZ  # one resample at most
        audio = resample(np.concatenate(samples), rate_hz, to_hz)
        item.id = item.id or new_id("item")
        self._items[item.id] = (item, previous_item_id)
        self.num_pending_commits += 1  # a response.create meanwhile answers it once it is heard
        self.link.transcribe(item.id, audio, self.live_config(), to_hz)
        return True

    def _item_heard(self, event) -> None:
        item, previous_item_id = self._items.pop(event.item_id, (None, None))
        if item is None:
            return
        self.num_pending_commits -= 1
        if event.error is not None:
            self._failed(event.error, event.item_id)
            return
        for part in item.content:
            if part.type == "input_audio":
                part.transcript, part.audio = event.text, None  # one transcript for the item's audio
                event = msgspec.structs.replace(event, text="")  # on its first part only
        self.conn.add_client_item(item, previous_item_id)
        transcript = item_text(item)
        self.conn.emit(InputTranscriptionCompleted(item_id=item.id, transcript=transcript,
                                                   usage=TranscriptUsage(round(event.audio_s, 3))))
        if self._deferred and not self.num_pending_commits:
            self.conn.create_response(self._deferred.pop(0))

    def defer_response(self, options) -> bool:
        """response.create right after a commit answers the committed audio: it waits for the transcript
        (OpenAI creates the item at commit and transcribes beside it; here the words come first)."""
        if not self.num_pending_commits:
            return False
        self._deferred.append(options)
        return True

    def clear(self) -> None:
        self.conn.audio.clear()
        if self.link is not None:
            self.link.clear()
        self.num_uncommitted_samples = 0
        self.num_pending_commits, self._deferred = 0, []
        if self.item_id is not None and self.conn.state is State.STREAMING:
            self.conn.drop_input()  # the words of the cleared turn leave the prompt too
        self.item_id = None
        self.conn.emit(InputAudioBufferCleared())

    def _check_link(self) -> None:
        if self.link is None:
            self.conn.audio.commit()  # raises audio_not_supported

    # -- recogniser events ----------------------------------------------------------------------------

    def on_event(self, event: LiveEvent) -> None:
        match event:
            case SpeechStarted():
                self._started(event)
            case SpeechStopped():
                self.conn.emit(SpeechStoppedEvent(audio_end_ms=event.audio_end_ms, item_id=self._item()))
            case TranscriptDelta():
                self._delta(event.text, event.gap)
            case TranscriptDone():
                self._done(event)
            case SpeechFailed():
                self._failed(event.message)
            case ItemTranscribed():
                self._item_heard(event)

    def _item(self) -> str:
        self.item_id = self.item_id or new_id("item")
        return self.item_id

    def _audio_index(self, item_id: str) -> int:
        """Where the committed item's audio part is: 0, or after the live video the words followed
        (rill.transports.realtime.video)."""
        item = next((i for i in self.conn.conversation.items if i.id == item_id), None)
        parts = (item.content or []) if item is not None else []
        return next((k for k, part in enumerate(parts) if part.type == "input_audio"), 0)

    def _started(self, event: SpeechStarted) -> None:
        self.conn.emit(SpeechStartedEvent(audio_start_ms=event.audio_start_ms, item_id=self._item()))
        turn = self.conn.settings.turn_detection
        if turn is not None and turn.interrupt_response:
            if self.conn.state is State.RESPONDING:
                self.conn.interrupt()  # barge-in
            self.conn.spoken.barge_in()  # a spoken answer still playing: cut to what was heard by now

    def _delta(self, text: str, gap: str = "") -> None:
        item_id = self._item()
        index = self.conn.video.audio_index()  # after the live video the words follow, as the committed item has it
        self.conn.emit(InputTranscriptionDelta(item_id=item_id, delta=text, content_index=index))
        if self.conn.speaks_vllm:  # vLLM's event, for vLLM's clients only: one running text, in which a
            # later turn's first word keeps the space the model wrote before it
            self.conn.emit(TranscriptionDelta(delta=gap + text))
        if not self._transcribing_only:
            if self.conn.state is State.COMMITTED:
                self.conn.drop_input()  # an uncommitted-to answer: the new words make a new turn
            self.conn.append_text(text)

    def _done(self, event: TranscriptDone) -> None:
        opened = self.item_id is not None  # speech_started named the turn's item
        item_id, self.item_id = self._item(), None
        text = event.text
        if text:
            self._heard.append(text)
        if text or event.by_commit or opened:  # every turn is an item, as OpenAI's server_vad commits the
            # buffer at each end of speech: a commit of silence, or a sound that held no words, has an empty
            # transcript (and is not answered below: the chat model reads words)
            self._commit_item(item_id, text)
            self.conn.emit(InputTranscriptionCompleted(item_id=item_id, transcript=text,
                                                       content_index=self._audio_index(item_id),
                                                       usage=TranscriptUsage(round(event.audio_s, 3))))
        if event.final:
            self.conn.emit(TranscriptionDone(text=" ".join(self._heard)))
        if event.by_commit and self.num_pending_commits:
            self.num_pending_commits -= 1
            if self._deferred:
                self.conn.create_response(self._deferred.pop(0))
                return
        turn = self.conn.settings.turn_detection
        auto = turn is not None and turn.create_response and not event.final and not event.by_commit
        if text and auto and self.conn.state is State.COMMITTED:
            self.conn.create_response(None)

    def _commit_item(self, item_id: str, text: str) -> None:
        conn = self.conn
        if self._transcribing_only or not conn.has_streamed_input:
            item = audio_item(item_id, text)
            previous = conn.conversation.add(item)
            conn.emit(InputAudioBufferCommitted(item_id=item_id, previous_item_id=previous))
            conn.item_added(item, previous)
            return
        conn.commit_spoken_text(audio_item(item_id, ""))  # the streamed words fill in its transcript

    def _failed(self, message: str, item_id: str | None = None) -> None:
        item_id = item_id or self.item_id
        self.item_id = None
        error = ErrorDetail("server_error", "speech_failed", f"speech recognition failed: {message}")
        if item_id is not None:
            self.conn.emit(InputTranscriptionFailed(item_id=item_id, error=error))
        else:
            failure = RealtimeError("speech_failed", error.message, kind="server_error")
            self.conn.emit(error_event(failure, None))
