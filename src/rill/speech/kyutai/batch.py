"""Kyutai STT as a causal model of the speech worker (rill.speech.causal): many KyutaiStreams advanced
together, Mimi's encoder passes and the decoder's steps each one forward for all of them.

The batch is built afresh each step from the streams' own states (rill.speech.kyutai.attention's
RowsKV: each row's sliding-window cache, left-padded to the longest and masked), so a stream owns all
it holds and a closed stream frees everything with its object; every row computes what the stream
computes alone (tests/test_kyutai_live_batch.py pins the tokens). Mimi's first pass of a stream runs
alone (a conv's initial padding may repeat the stream's own first sample); later passes batch by
equal frame counts, the common count first.
"""

from __future__ import annotations

import numpy as np
import torch

from rill.speech.causal import CausalInfo
from rill.speech.kyutai.loader import KyutaiRuntime
from rill.speech.kyutai.stream import KyutaiStream

# The languages of Kyutai's released STT models (stt-1b-en_fr: English and French; stt-2.6b-en: English).
# config.json does not say which a directory holds, so a session may ask for either.
KYUTAI_LANGUAGES = ("en", "fr")


class KyutaiCausal:
    """CausalModel over one loaded runtime."""

    def __init__(self, runtime: KyutaiRuntime):
        self.runtime = runtime
        frame_s = runtime.frame_size / runtime.sampling_rate
        self.info = CausalInfo(frame_s, runtime.padding.silence_prefix_s, runtime.padding.delay_s, KYUTAI_LANGUAGES,
                               runtime.sampling_rate)

    def open_stream(self, input_rate: int) -> KyutaiStream:
        return KyutaiStream(self.runtime, input_rate)

    def step(self, streams: list[KyutaiStream], max_frames: int) -> None:
        """Encode up to `max_frames` queued frames of each stream, then run decoder steps, all rows at
        once, until no stream has a step ready."""
        self._encode(streams, max_frames)
        while rows := [s for s in streams if s.wants_step]:
            self._decode(rows)

    def _encode(self, streams: list[KyutaiStream], max_frames: int) -> None:
        budget = {id(s): min(s.num_ready_frames, max_frames) for s in streams}
        for stream in streams:
            if budget[id(stream)] and not stream.mimi_state.num_steps:
                self._encode_rows([stream], budget[id(stream)])
                budget[id(stream)] = 0
        while rows := [s for s in streams if budget[id(s)]]:
            num_frames = min(budget[id(s)] for s in rows)
            self._encode_rows(rows, num_frames)
            for stream in rows:
                budget[id(stream)] -= num_frames

    def _encode_rows(self, rows: list[KyutaiStream], num_frames: int) -> None:
        mimi, device, k = self.runtime.mimi, self.runtime.device, self.runtime.spec.num_codebooks
        audio = torch.from_numpy(np.stack([s.take_frames(num_frames) for s in rows])).to(device)
        if len(rows) == 1:
            codes = mimi.encode(audio, rows[0].mimi_state, k)
        else:
            codes = mimi.encode_rows(audio, [s.mimi_state for s in rows], k)
        for stream, stream_codes in zip(rows, codes):
            stream.add_codes(stream_codes)

    def _decode(self, rows: list[KyutaiStream]) -> None:
        decoder, device = self.runtime.decoder, self.runtime.device
        inputs = [s.step_inputs() for s in rows]
        text = torch.stack([t for t, _ in inputs]).to(device)
        codes = torch.stack([c for _, c in inputs]).to(device)
        if len(rows) == 1:
            logits = decoder.step(text, codes, rows[0].decoder_state)
        else:
            logits = decoder.step_rows(text, codes, [s.decoder_state for s in rows])
        for stream, row in zip(rows, logits):
            stream.take_logits(row)
