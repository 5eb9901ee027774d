"""KyutaiStream: audio chunks in, text tokens and text deltas out, as the audio arrives.

Each whole 80 ms frame is encoded by Mimi (with its caches) and gives one decoder step, whose greedy
token is the stream's next text token; the text lags the audio by the model's delay. `finish()` appends
what transformers' feature extractor appends to a clip (the delay plus one second of silence) and stops
after as many steps as `generate` takes for that padded clip (one per whole frame), so a clip streamed in
any pieces gives the tokens the whole clip gives.

The work is split so that many streams can share it (rill.speech.kyutai.batch): `push` queues audio,
whole frames are taken out for Mimi (`take_frames` / `add_codes`), and each decoder step reads
`step_inputs` and gives back its logits (`take_logits`); `feed` and `finish` do all of that alone.

What a stream holds is bounded whatever its length: the resampler's and the convs' few samples, less than
one frame of pending audio, each attention layer's last window - 1 keys and values, the last token and the
detokenizer's short window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

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
    pieces: list[str] = field(default_factory=list)  # the text each token adds ("" for a pad)


class KyutaiStream:
    """One live stream over a shared KyutaiRuntime. Not thread-safe; one per audio source."""

    def __init__(self, runtime: KyutaiRuntime, input_rate: int | None = None, *, keep_logits: bool = False):
        self.runtime = runtime
        self.input_rate = input_rate or runtime.sampling_rate
        self._resampler = StreamResampler(self.input_rate, runtime.sampling_rate)
        self._audio = np.zeros(0, dtype=np.float32)  # 24 kHz samples not yet encoded (whole frames and a part)
        self._codes: deque[torch.Tensor] = deque()  # [K] codes of frames encoded, waiting for their step
        self._mimi = runtime.mimi.new_state()
        self._decoder = runtime.decoder.new_state()
        self._detok = Detokenizer(runtime.tokenizer, []) if runtime.tokenizer is not None else None
        self._recent_ids: deque[int] = deque(maxlen=NUM_CONTEXT_TOKENS)
        self._num_detok_ids = 0  # ids given to the current Detokenizer
        self._last_token: int | None = None  # sampled at the last step, fed at the next
        self._new_tokens: list[int] = []  # sampled since the last delta
        self.logits: list[torch.Tensor] | None = [] if keep_logits else None  # for parity tests only
        self.max_steps: int | None = None  # generate's step count, known at the end of the audio
        self.num_samples = 0  # 24 kHz samples received (padding included)
        self.num_frames = 0  # frames encoded
        self.ended = False  # no more audio (end() was called)
        self.finished = False  # finish() returned: the text is flushed

    @property
    def num_steps(self) -> int:
        return self._decoder.num_positions

    @property
    def mimi_state(self):
        return self._mimi

    @property
    def decoder_state(self):
        return self._decoder

    @property
    def audio_s(self) -> float:
        return self.num_samples / self.runtime.sampling_rate

    @property
    def num_state_bytes(self) -> int:
        """What the stream's caches and queues hold: flat over an hour-long stream."""
        queued = self._audio.nbytes + sum(c.numel() * c.element_size() for c in self._codes)
        return self._mimi.num_bytes + self._decoder.num_bytes + queued

    # -- alone ----------------------------------------------------------------------------------------

    def feed(self, pcm: np.ndarray) -> StreamDelta:
        """Mono float samples at `input_rate`, any length: returns the tokens that whole frames allow."""
        if self.ended:
            raise RuntimeError("the stream is finished")
        self.push(pcm)
        self._run_alone()
        return self.pop_delta()

    def finish(self) -> StreamDelta:
        """End of audio: flush the resampler, pad with silence, run the last steps, flush the text."""
        if self.finished:
            return StreamDelta([], "")
        self.end()
        self._run_alone()
        return self.pop_delta()

    def _run_alone(self) -> None:
        if self.num_ready_frames:
            audio = torch.from_numpy(self.take_frames(self.num_ready_frames)).to(self.runtime.device)[None]
            self.add_codes(self.runtime.mimi.encode(audio, self._mimi, self.runtime.spec.num_codebooks)[0])
        while self.wants_step:
            text, codes = self.step_inputs()
            self.take_logits(self.runtime.decoder.step(text[None].to(self.runtime.device), codes[None], self._decoder)[0])

    # -- the parts a batch runs -----------------------------------------------------------------------

    def push(self, pcm: np.ndarray) -> None:
        """Queue mono float samples at `input_rate` (resampled to the model's rate as they come)."""
        self._queue(self._resampler.push(np.asarray(pcm, dtype=np.float32), last=False))

    def end(self) -> None:
        """No more audio: flush the resampler and append what the feature extractor appends to a clip.
        generate() takes one step per whole frame of the padded clip: that is the stream's last step."""
        if self.ended:
            return
        tail = self._resampler.push(np.zeros(0, dtype=np.float32), last=True)
        self._queue(np.concatenate([tail, np.zeros(self.runtime.padding.suffix_samples, dtype=np.float32)]))
        self.ended = True
        self.max_steps = self.num_samples // self.runtime.frame_size

    def _queue(self, samples: np.ndarray) -> None:
        if self.num_samples == 0:  # the feature extractor's silence prefix, then position 0 (both BOS)
            samples = np.concatenate([np.zeros(self.runtime.padding.prefix_samples, np.float32), samples])
        self.num_samples += samples.size
        self._audio = np.concatenate([self._audio, samples]) if self._audio.size else samples

    @property
    def num_ready_frames(self) -> int:
        """Whole frames queued for Mimi (none past the last step's)."""
        frames = self._audio.size // self.runtime.frame_size
        if self.max_steps is not None:  # frame f feeds step f + 1: later frames are never read
            frames = min(frames, max(0, self.max_steps - 1 - self.num_frames))
        return frames

    def take_frames(self, num_frames: int) -> np.ndarray:
        """The next `num_frames` whole frames' samples, out of the queue (for Mimi)."""
        size = num_frames * self.runtime.frame_size
        taken, self._audio = self._audio[:size], self._audio[size:].copy()
        return taken

    def add_codes(self, codes: torch.Tensor) -> None:
        """[F, K] codes of the frames just encoded, each waiting for its decoder step."""
        self.num_frames += codes.shape[0]
        self._codes.extend(codes)

    @property
    def wants_step(self) -> bool:
        """Position 0 (BOS) or a frame's codes are ready, and the last step is not behind us."""
        if self.max_steps is not None and self.num_steps >= self.max_steps:
            return False
        return self.num_steps == 0 or bool(self._codes)

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next step's text id [] and codes [K]: BOS at position 0, then the last token with frame p - 1."""
        if self.num_steps == 0:
            text, codes = self.runtime.decoder.first_inputs(1, self.runtime.device)
            return text[0], codes[0]
        return torch.tensor(self._last_token), self._codes.popleft()

    def take_logits(self, logits: torch.Tensor) -> int:
        """The step's logits [vocab]: its greedy token is the stream's next."""
        if self.logits is not None:
            self.logits.append(logits.clone())
        self._last_token = int(logits.argmax())
        self._new_tokens.append(self._last_token)
        return self._last_token

    @property
    def drained(self) -> bool:
        """Ended and every step run: the next `pop_delta` is the last."""
        return self.ended and not self.wants_step and not self.num_ready_frames

    def pop_delta(self) -> StreamDelta:
        """The tokens sampled since the last call and their text; after the last step, the text flushed."""
        tokens, self._new_tokens = self._new_tokens, []
        pieces = [self._detokenize(t) for t in tokens] if self._detok is not None else ["" for _ in tokens]
        if self.drained and not self.finished:
            self.finished = True
            self._codes.clear()
            if self._detok is not None and (flushed := self._detok.flush()):
                pieces[-1:] = [(pieces[-1] if pieces else "") + flushed]  # the last token's text, completed
        return StreamDelta(tokens, "".join(pieces), pieces)

    def _detokenize(self, token_id: int) -> str:
        text = self._detok.add(token_id)
        self._recent_ids.append(token_id)
        self._num_detok_ids += 1
        # Only once the text so far is released whole (nothing held for an open character).
        if self._num_detok_ids >= DETOK_RESET_TOKENS and text and not self._detok.utf8_held:
            self._detok = Detokenizer(self.runtime.tokenizer, list(self._recent_ids))
            self._num_detok_ids = 0
        return text
