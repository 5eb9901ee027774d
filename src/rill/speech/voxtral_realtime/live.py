"""Voxtral Realtime as a causal model of the speech worker (rill.speech.causal): realtime sessions and
Mode A/B audio chunks run VoxtralStreams there, as Kyutai's do.

Each worker step takes every live stream's next `max_frames` frames of queued audio through the front end
(stream by stream), then the encoder layers and the projector of all streams as one batch (each row its own
convolution, rotary position and sliding-window caches: AudioTower.stream_rows), and runs each stream's
prompt positions (alone: their tokens are known, several at once); then the decoder positions past the prompt of all streams run together, one position per stream
per forward (rill.speech.kyutai.attention's RowsKV: each row its own sliding-window cache), until no stream
has a frame left. Each row computes what the stream computes alone (tests/test_voxtral_realtime_live.py
pins the tokens).
"""

from __future__ import annotations

import torch

from rill.speech.causal import CausalInfo
from rill.speech.voxtral_realtime.loader import VoxtralRuntime
from rill.speech.voxtral_realtime.stream import VoxtralStream

# The languages Mistral lists for Voxtral Mini 4B Realtime. The model is told none: it hears which.
VOXTRAL_LANGUAGES = ("en", "zh", "hi", "es", "ar", "fr", "pt", "ru", "de", "ja", "ko", "it", "nl")


class VoxtralCausal:
    """CausalModel over one loaded runtime; every stream at the same delay (the rows could differ)."""

    def __init__(self, runtime: VoxtralRuntime, delay_ms: float | None = None, early_stop: bool = False):
        self.runtime, self.delay_ms, self.early_stop = runtime, delay_ms, early_stop
        audio = runtime.audio
        frame_s = audio.frame_samples / audio.sampling_rate
        # Position p's token has heard the padded audio up to (p + 1) frames: the left padding is the prefix.
        self.info = CausalInfo(frame_s, audio.num_left_pad_tokens * frame_s,
                               audio.num_delay_tokens(delay_ms) * frame_s, VOXTRAL_LANGUAGES, audio.sampling_rate)
        self.max_rows = 0  # the most streams one decoder forward has run together
        self.max_encoder_rows = 0  # ... and one encoder forward
        self.batch_encoder = True  # False: each stream's encoder pass alone (the comparison's "before")

    def open_stream(self, input_rate: int) -> VoxtralStream:
        return VoxtralStream(self.runtime, input_rate, delay_ms=self.delay_ms, early_stop=self.early_stop)

    def step(self, streams: list[VoxtralStream], max_frames: int) -> None:
        if self.batch_encoder:
            self._encode([(s, s.take_mel(max_frames)) for s in streams])
            for stream in streams:
                stream.run_prompt()
        else:  # each stream's encoder alone (for comparison: benchmarks/voxtral-live-streams.py)
            for stream in streams:
                stream.prepare(max_frames)
        while rows := [s for s in streams if s.wants_step]:
            self._decode(rows)
        for stream in streams:
            stream.settle()

    def _encode(self, mels: list[tuple[VoxtralStream, torch.Tensor | None]]) -> None:
        """The streams' new mel frames through the encoder as one batch, then the projector as one."""
        rows = [(s, mel) for s, mel in mels if mel is not None]
        if not rows:
            return
        model = self.runtime.model
        self.max_encoder_rows = max(self.max_encoder_rows, len(rows))
        frames = model.audio_tower.stream_rows([mel for _, mel in rows], [s.encoder_state for s, _ in rows])
        counts = [f.shape[1] for f in frames]
        if not sum(counts):
            return
        with torch.inference_mode():
            projected = model.multi_modal_projector(torch.cat(frames, dim=1))
        for (stream, _), part in zip(rows, projected.split(counts, dim=1)):
            stream.take_encoded(part, projected=True)

    def _decode(self, rows: list[VoxtralStream]) -> None:
        model, device = self.runtime.model, self.runtime.device
        inputs = [s.step_inputs() for s in rows]
        self.max_rows = max(self.max_rows, len(rows))
        tokens = torch.tensor([[token] for token, _ in inputs], device=device)
        audio = torch.cat([a for _, a in inputs])  # [B, 1, D]
        if len(rows) == 1:
            hidden = model.language_model(tokens, audio, rows[0].decoder_state)
        else:
            hidden = model.language_model.forward_rows(tokens, audio, [s.decoder_state for s in rows])
        with torch.inference_mode():
            logits = model.lm_head(hidden[:, -1]).float()
        for stream, row in zip(rows, logits):
            stream.take_logits(row)
