"""KyutaiStream: audio chunks in, text tokens and text deltas out, as the audio arrives.

Each whole 80 ms frame is encoded by Mimi (with its caches) and gives one decoder step, whose greedy
token is the stream's next text token; the text lags the audio by the model's delay. `finish()` appends
what transformers' feature extractor appends to a clip (the delay plus one second of silence) and stops
after as many steps as `generate` takes for that padded clip (one per whole frame), so a clip streamed in
any pieces gives the tokens the whole clip gives.

What a stream holds is bounded whatever its length: the resampler's and the convs' few samples, less than
one frame of pending audio, each attention layer's last window - 1 keys and values, the last token and the
detokenizer's short window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from rill.speech.kyutai.loader import KyutaiRuntime
from rill.speech.kyutai.resample import StreamResampler
from rill.tokenizer.detokenizer import NUM_CONTEXT_TOKENS, Detokenizer

# A Detokenizer keeps every id and every piece of text it released; a stream starts a new one this often,
# with the last few ids as its context (as the engine's detokenizer starts after a prompt), so that an
# hour-long stream holds a short window of ids, not the hour's.
DETOK_RESET_TOKENS = 1024


@dataclass(frozen=True)
class StreamDelta:
    token_ids: list[int]  # one per decoder step run by this call (pads and specials included)
    text: str  # the text those tokens add, specials skipped


class KyutaiStream:
    """One live stream over a shared KyutaiRuntime. Not thread-safe; one per audio source."""

    def __init__(self, runtime: KyutaiRuntime, input_rate: int | None = None, *, keep_logits: bool = False):
        self.runtime = runtime
        self.input_rate = input_rate or runtime.sampling_rate
        self._resampler = StreamResampler(self.input_rate, runtime.sampling_rate)
        self._pending = np.zeros(0, dtype=np.float32)  # 24 kHz samples short of a whole frame
        self._mimi = runtime.mimi.new_state()
        self._decoder = runtime.decoder.new_state()
        self._detok = Detokenizer(runtime.tokenizer, []) if runtime.tokenizer is not None else None
        self._recent_ids: deque[int] = deque(maxlen=NUM_CONTEXT_TOKENS)
        self._num_detok_ids = 0  # ids given to the current Detokenizer
        self._last_token: int | None = None  # sampled at the last step, fed at the next
        self.logits: list[torch.Tensor] | None = [] if keep_logits else None  # for parity tests only
        self.num_samples = 0  # 24 kHz samples received (padding included)
        self.num_frames = 0  # frames encoded
        self.finished = False
        self._started = False

    @property
    def num_steps(self) -> int:
        return self._decoder.num_positions

    @property
    def audio_s(self) -> float:
        return self.num_samples / self.runtime.sampling_rate

    def feed(self, pcm: np.ndarray) -> StreamDelta:
        """Mono float samples at `input_rate`, any length: returns the tokens that whole frames allow."""
        if self.finished:
            raise RuntimeError("the stream is finished")
        return self._push(self._resampler.push(np.asarray(pcm, dtype=np.float32), last=False), final=False)

    def finish(self) -> StreamDelta:
        """End of audio: flush the resampler, pad with silence, run the last steps, flush the text."""
        if self.finished:
            return StreamDelta([], "")
        tail = self._resampler.push(np.zeros(0, dtype=np.float32), last=True)
        padded = np.concatenate([tail, np.zeros(self.runtime.padding.suffix_samples, dtype=np.float32)])
        delta = self._push(padded, final=True)
        self.finished = True
        flushed = self._detok.flush() if self._detok is not None else ""
        return StreamDelta(delta.token_ids, delta.text + flushed)

    def _push(self, samples: np.ndarray, final: bool) -> StreamDelta:
        if not self._started:  # the feature extractor's silence prefix, then position 0 (both BOS)
            self._started = True
            samples = np.concatenate([np.zeros(self.runtime.padding.prefix_samples, np.float32), samples])
        self.num_samples += samples.size
        # generate() takes one step per whole frame of the padded clip; before the end none is the last.
        limit = self.num_samples // self.runtime.frame_size if final else None
        audio = np.concatenate([self._pending, samples]) if self._pending.size else samples
        whole = audio.size - audio.size % self.runtime.frame_size
        self._pending = audio[whole:].copy()
        tokens = []
        if self.num_steps == 0 and (limit is None or limit > 0):
            tokens.append(self._step(*self.runtime.decoder.first_inputs(1, self.runtime.device)))
        if whole:
            x = torch.from_numpy(audio[:whole]).to(self.runtime.device)[None]
            codes = self.runtime.mimi.encode(x, self._mimi, self.runtime.spec.num_codebooks)[0]  # [F, K]
            self.num_frames += codes.shape[0]
            for frame in codes:  # frame f feeds step f + 1
                if limit is not None and self.num_steps >= limit:
                    break
                tokens.append(self._step(torch.tensor([tokens[-1] if tokens else self._last_token]), frame[None]))
        text = "".join(self._detokenize(t) for t in tokens) if self._detok is not None else ""
        return StreamDelta(tokens, text)

    def _detokenize(self, token_id: int) -> str:
        text = self._detok.add(token_id)
        self._recent_ids.append(token_id)
        self._num_detok_ids += 1
        # Only once the text so far is released whole (nothing held for an open character).
        if self._num_detok_ids >= DETOK_RESET_TOKENS and text and not self._detok.utf8_held:
            self._detok = Detokenizer(self.runtime.tokenizer, list(self._recent_ids))
            self._num_detok_ids = 0
        return text

    def _step(self, text: torch.Tensor, codes: torch.Tensor) -> int:
        logits = self.runtime.decoder.step(text.to(self.runtime.device), codes, self._decoder)
        if self.logits is not None:
            self.logits.append(logits[0].clone())
        self._last_token = int(logits[0].argmax())
        return self._last_token
