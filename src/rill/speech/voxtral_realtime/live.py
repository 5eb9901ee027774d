"""Voxtral Realtime as a causal model of the speech worker (rill.speech.causal): realtime sessions and
Mode A/B audio chunks run VoxtralStreams there, as Kyutai's do.

Each worker step advances every live stream by at most `max_frames` frames of its queued audio, one
stream after another: a stream's positions are not yet batched with other streams' (Kyutai's decoder
steps are, rill.speech.kyutai.batch; Voxtral's are a later piece of issue 56). What a step gives a
stream is exactly what feeding it alone gives (tests/test_voxtral_realtime_live.py).
"""

from __future__ import annotations

from rill.speech.causal import CausalInfo
from rill.speech.voxtral_realtime.loader import VoxtralRuntime
from rill.speech.voxtral_realtime.stream import VoxtralStream

# The languages Mistral lists for Voxtral Mini 4B Realtime. The model is told none: it hears which.
VOXTRAL_LANGUAGES = ("en", "zh", "hi", "es", "ar", "fr", "pt", "ru", "de", "ja", "ko", "it", "nl")


class VoxtralCausal:
    """CausalModel over one loaded runtime; every stream at the same delay."""

    def __init__(self, runtime: VoxtralRuntime, delay_ms: float | None = None):
        self.runtime, self.delay_ms = runtime, delay_ms
        audio = runtime.audio
        frame_s = audio.frame_samples / audio.sampling_rate
        # Position p's token has heard the padded audio up to (p + 1) frames: the left padding is the prefix.
        self.info = CausalInfo(frame_s, audio.num_left_pad_tokens * frame_s,
                               audio.num_delay_tokens(delay_ms) * frame_s, VOXTRAL_LANGUAGES)

    def open_stream(self, input_rate: int) -> VoxtralStream:
        return VoxtralStream(self.runtime, input_rate, delay_ms=self.delay_ms)

    def step(self, streams: list[VoxtralStream], max_frames: int) -> None:
        for stream in streams:
            stream.advance(max_frames)
