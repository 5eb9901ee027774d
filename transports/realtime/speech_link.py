"""The realtime connection's recogniser on the real speech worker: a LiveTranscriber (rill.speech.live)
running in the connection's nursery, whose events join the connection's inbox in order. A causal
model (a speech core with live streams: Kyutai STT) gets a CausalLiveTranscriber instead
(rill.speech.causal_live), with the same calls and events and no re-decoding passes.

`configure` replaces the recogniser (turn detection or transcription settings changed): audio the
old one had not finished with is dropped, as a cleared buffer. `wait_for_room` is what the client
reader awaits before it reads the next frame, so a client that sends audio faster than it can be
recognised is held by WebSocket flow control instead of growing the server's memory. `turn_end`
(set by the driver once the connection exists: transports/realtime/turn_end.py) answers
semantic_vad's end-of-turn question.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import trio

from rill.errors import RillError
from rill.speech.decoding import TranscribeParams, validate_params
from rill.speech.causal_live import CausalLiveTranscriber, live_transcriber
from rill.speech.live import LiveConfig, LiveTranscriber


class ItemTranscribed(msgspec.Struct, frozen=True):
    """A client-created item's input_audio, transcribed (or the reason it could not be)."""

    item_id: str
    text: str = ""
    audio_s: float = 0.0
    error: str | None = None


class LiveSpeechLink:
    def __init__(self, speech, nursery: trio.Nursery, inbox: trio.MemorySendChannel):
        self.speech = speech  # AsyncSpeechEngine
        self.model_name = speech.model_name
        self._nursery, self._inbox = nursery, inbox
        self._live: LiveTranscriber | CausalLiveTranscriber | None = None
        self._scope: trio.CancelScope | None = None
        self._changed = trio.Event()
        self.turn_end = None  # TurnEndScorer | None

    @property
    def live(self) -> LiveTranscriber | CausalLiveTranscriber | None:
        return self._live

    @property
    def is_causal(self) -> bool:
        """A causal model: its core runs live streams (rill.speech.causal)."""
        return getattr(self.speech.core, "live", None) is not None

    def configure(self, config: LiveConfig) -> None:
        """Raises ValidationError (and changes nothing) for a language or prompt the model cannot take."""
        if self.is_causal:
            self.speech.core.check_live(config.language, config.prompt)
        else:
            validate_params(self.speech.core.runtime.generation, TranscribeParams(language=config.language,
                                                                                  prompt=config.prompt))
        if self._scope is not None:
            self._scope.cancel()
            self._live.failed = True  # wakes a reader held by wait_for_room on the old recogniser
            self._live._signal_progress()
        send, recv = trio.open_memory_channel(math.inf)  # bounded by the passes and turns of one stream
        self._live = live_transcriber(self.speech, config, send.send_nowait, turn_end=self._turn_end)
        self._scope = trio.CancelScope()
        self._nursery.start_soon(self._run, self._live, self._scope, send, recv)
        self._changed.set()
        self._changed = trio.Event()

    async def _turn_end(self, text: str) -> float | None:
        return await self.turn_end(text) if self.turn_end is not None else None

    async def _run(self, live: LiveTranscriber | CausalLiveTranscriber, scope: trio.CancelScope, send, recv) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(live.run)
                async with recv, send:
                    async for event in recv:
                        await self._inbox.send(event)

    @property
    def input_rate(self) -> int:
        """The rate the speech model hears: 16 kHz, or a causal model's own (Kyutai: 24 kHz)."""
        return self.speech.input_rate

    def transcribe(self, item_id: str, samples: np.ndarray, config: LiveConfig, rate_hz: int = 16_000) -> None:
        """One recording, whole (a conversation.item.create input_audio part), at 16 kHz or at `input_rate`:
        ItemTranscribed joins the inbox."""
        async def run() -> None:
            params = TranscribeParams(language=config.language, prompt=config.prompt)
            done = ItemTranscribed(item_id, error="the speech engine gave no transcription")
            try:
                async for delta in self.speech.transcribe(samples, params, sample_rate=rate_hz):
                    if delta.finished is not None:
                        done = ItemTranscribed(item_id, delta.finished.text, delta.finished.duration_s)
            except RillError as exc:
                done = ItemTranscribed(item_id, error=str(exc))
            await self._inbox.send(done)

        self._nursery.start_soon(run)

    def feed(self, samples_16k: np.ndarray, native: np.ndarray | None = None, rate_hz: int = 16_000) -> None:
        """Whisper hears the 16 kHz copy; a causal recogniser gets the audio as sent too (its model may hear
        at that rate: rill.speech.causal_live)."""
        if isinstance(self._live, CausalLiveTranscriber):
            self._live.feed(samples_16k, native, rate_hz)
        else:
            self._live.feed(samples_16k)

    def commit(self, final: bool) -> None:
        self._live.commit(final)

    def clear(self) -> None:
        self._live.clear()

    async def wait_for_room(self) -> None:
        if self._live is not None:
            await self._live.wait_for_room()

    def close(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
