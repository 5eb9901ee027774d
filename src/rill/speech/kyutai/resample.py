"""Streaming resampling to the model's rate with libsoxr (soxr.ResampleStream).

soxr's streaming resampler keeps its filter state between calls, so a recording pushed in pieces of any
size gives the samples one `last=True` call over the whole recording gives (tests pin this exactly).
At the model's own rate it is a pass-through.
"""

from __future__ import annotations

import numpy as np
import soxr


class StreamResampler:
    def __init__(self, input_rate: int, output_rate: int):
        if input_rate <= 0:
            raise ValueError(f"input_rate must be positive (found {input_rate})")
        self.input_rate, self.output_rate = input_rate, output_rate
        self._stream = None
        if input_rate != output_rate:
            self._stream = soxr.ResampleStream(input_rate, output_rate, 1, dtype="float32")

    def push(self, pcm: np.ndarray, last: bool) -> np.ndarray:
        """Mono float32 samples at input_rate -> those now ready at output_rate (all of them when last)."""
        if self._stream is None:
            return pcm
        return self._stream.resample_chunk(pcm, last=last)


def resample_whole(pcm: np.ndarray, input_rate: int, output_rate: int) -> np.ndarray:
    """A whole recording at once: what a stream of it gives, in one call."""
    return StreamResampler(input_rate, output_rate).push(np.asarray(pcm, dtype=np.float32), last=True)
