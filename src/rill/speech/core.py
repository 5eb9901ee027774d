"""SpeechCore: the synchronous, I/O-free engine of speech in, with continuous batching of decoder steps.

One worker thread owns it (as EngineCore for the LLM). Each `step()`:

1. one decoder step for every row already decoding (all rows in one call, each at its own position);
2. rows whose window ended leave (a request with more audio goes back to the queue for its next window);
3. waiting windows take the free rows (up to `max_batch`): their log-mel features are encoded in one
   batched encoder call, the cross-attention K/V of each is written into its row once, the language is
   detected where needed, and their prompts are prefilled together, giving each its first token.

Admission comes in groups of `admit_group` rows, a quarter of `max_batch` by default (fewer when all
that wait fit, or when no row decodes): an admission (log-mel, encoder, language, prefill) has a fixed
cost that a batch shares, on a GPU about ten decode steps of kernel launches, while a decode step costs
about the same with a few idle rows. So under load rows are refilled together rather than one by one
as they free up (16 rows of rill-tiny-speech: 4.3x faster on an H100, 1.14-1.29x on 2 CPU cores).

Rows are kept contiguous (a leaving row's slot takes the last row), so every call works on a slice of
the preallocated caches: no gather, no copies per step. Abort frees a row at once.
"""

from __future__ import annotations

import enum
from collections import deque
from pathlib import Path

import numpy as np
import torch

from rill.errors import ModelLoadError, ValidationError
from rill.speech.decoding import (LogitRules, Segment, SpeechDelta, TranscribeParams, Transcription,
                                  carry_previous, decoder_prompt, language_code, language_token_id,
                                  max_window_tokens, prefix_ids, sample, split_windows, text_ids,
                                  validate_params)
from rill.speech.features import FeatureConfig, LogMel
from rill.speech.whisper import WhisperRuntime, load_whisper
from rill.tokenizer import Detokenizer

SAMPLE_RATE = 16_000


class Status(enum.Enum):
    WAITING = "waiting"  # for a row (its first or its next window)
    DECODING = "decoding"  # holds a row
    FINISHED = "finished"


_TRANSITIONS = {
    Status.WAITING: {Status.DECODING},
    Status.DECODING: {Status.WAITING, Status.FINISHED},
    Status.FINISHED: set(),
}


class SpeechRequest:
    """One transcription's progress: its windows, the current window's decoding, what is done."""

    def __init__(self, request_id: str, audio: np.ndarray, params: TranscribeParams, language_id: int | None,
                 previous: list[int], window_samples: int, prefix: list[int] = ()):
        self.request_id = request_id
        self.params = params
        self.windows = split_windows(audio, window_samples)
        self.duration_s = len(audio) / SAMPLE_RATE
        self.window_s = window_samples / SAMPLE_RATE
        self.status = Status.WAITING
        self.language_id = language_id  # given, or detected on the first window
        self.previous = previous  # prompt text, then every window's output: the next window's prompt
        self.prefix = list(prefix)  # forced after the first window's special tokens (params.prefix)
        self.segments: list[Segment] = []
        self.text_parts: list[str] = []
        # the current window
        self.prompt: list[int] = []
        self.window_tokens: list[int] = []
        self.max_tokens = 0
        self.detokenizer: Detokenizer | None = None

    def move_to(self, status: Status) -> None:
        assert status in _TRANSITIONS[self.status], f"{self.status} -> {status}"
        self.status = status

    @property
    def num_windows_done(self) -> int:
        return len(self.segments)

    @property
    def window_prefix(self) -> list[int]:
        """The forced prefix of the current window: the first window's only."""
        return self.prefix if self.num_windows_done == 0 else []

    @property
    def num_windows(self) -> int:
        return len(self.windows)

    @property
    def last_position(self) -> int:
        """Decoder position of the last token fed (or about to be fed) in the current window."""
        return len(self.prompt) + len(self.window_tokens) - 1

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]


class SpeechCore:
    """Continuous batching of Whisper transcriptions. Synchronous; owned by one thread.

    The caches of all `max_batch` rows are allocated here, so a batch too large for memory fails at load,
    not mid-run: per row, decoder_layers x 2 x (max_target_positions + max_source_positions) x d_model
    values (whisper-tiny in float32: 24 MB, almost all of it the cross-attention K/V of a 30 s window).
    """

    def __init__(self, path_or_runtime: str | Path | WhisperRuntime, *, max_batch: int = 16,
                 device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int = 0,
                 admit_group: int | None = None):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if admit_group is not None and not 1 <= admit_group <= max_batch:
            raise ValueError(f"admit_group must be between 1 and max_batch ({max_batch}), got {admit_group}")
        runtime = path_or_runtime
        if not isinstance(runtime, WhisperRuntime):
            runtime = load_whisper(runtime, device, dtype)
        self.runtime = runtime
        self.model_name = runtime.name
        self.max_batch = max_batch
        self.admit_group = max(1, max_batch // 4) if admit_group is None else admit_group
        self.features = LogMel(FeatureConfig.from_dir(runtime.path), runtime.device)
        if self.features.config.nb_max_frames != runtime.config.num_frames:
            raise ModelLoadError(
                f"{runtime.path}: preprocessor_config.json gives {self.features.config.nb_max_frames} frames a "
                f"window, config.json's max_source_positions {runtime.config.max_source_positions} needs "
                f"{runtime.config.num_frames}")
        self.rules = LogitRules(runtime.generation, runtime.config.vocab_size, runtime.device)
        self.cache = runtime.new_cache(max_batch)
        self.generator = torch.Generator(runtime.device).manual_seed(seed)
        self.rows: list[SpeechRequest] = []  # row i of the caches decodes rows[i]'s current window
        self.waiting: deque[SpeechRequest] = deque()
        self.requests: dict[str, SpeechRequest] = {}

    # -- requests -------------------------------------------------------------------------------------

    @property
    def input_rate(self) -> int:
        """The rate whole recordings are heard at (every core has one: Kyutai's is 24 kHz)."""
        return SAMPLE_RATE

    def add_request(self, request_id: str, audio: np.ndarray, params: TranscribeParams,
                    sample_rate: int = SAMPLE_RATE) -> None:
        """Queue 16 kHz mono float32 audio (Whisper hears 16 kHz alone: another `sample_rate` is refused);
        raises ValidationError (and keeps nothing) if it cannot run."""
        if request_id in self.requests:
            raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
        if sample_rate != SAMPLE_RATE:
            raise ValidationError(f"{self.model_name} takes audio at {SAMPLE_RATE} Hz, got {sample_rate} Hz",
                                  param="sample_rate")
        validate_params(self.runtime.generation, params)
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValidationError(f"audio must be 1-D mono samples, got shape {audio.shape}", param="file")
        language_id = language_token_id(self.runtime.generation, params.language)
        request = SpeechRequest(request_id, audio, params, language_id, text_ids(self.runtime, params.prompt),
                                self.features.config.n_samples, prefix_ids(self.runtime, params.prefix))
        self.requests[request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> None:
        """Forget a request at once (its row, if any, is free for the next step). Unknown ids are ignored."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if request.status is Status.DECODING:
            self._free_row(self.rows.index(request))
        elif request.status is Status.WAITING:
            self.waiting.remove(request)

    def has_work(self) -> bool:
        return bool(self.rows or self.waiting)

    @property
    def num_decoding(self) -> int:
        return len(self.rows)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- the step -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[SpeechDelta]:
        deltas: list[SpeechDelta] = []
        if self.rows:
            self._decode_step(deltas)
        self._admit(deltas)
        return deltas

    def _decode_step(self, deltas: list[SpeechDelta]) -> None:
        rows = self.rows
        ids = torch.tensor([[r.window_tokens[-1]] for r in rows], device=self.runtime.device)
        start = torch.tensor([r.last_position for r in rows], device=self.runtime.device)
        logits = self.runtime.model.decoder(ids, start, self.cache.rows(slice(0, len(rows))))[:, -1]
        first = torch.zeros(len(rows), dtype=torch.bool, device=logits.device)
        self._accept(list(rows), self._sample(rows, logits, first), deltas)

    def _admit(self, deltas: list[SpeechDelta]) -> None:
        num_free = self.max_batch - len(self.rows)
        num_new = min(num_free, len(self.waiting))
        if num_new == 0 or (self.rows and num_new < min(self.admit_group, len(self.waiting))):
            return  # the free rows wait for a group (see the module's docstring)
        new = [self.waiting.popleft() for _ in range(num_new)]
        first_row = len(self.rows)
        for request in new:
            request.move_to(Status.DECODING)
            self.rows.append(request)
        cache = self.cache.rows(slice(first_row, len(self.rows)))
        windows = [r.windows[r.num_windows_done] for r in new]
        self.runtime.model.encode_into(self.features.batch(windows), cache)
        self._detect_languages(new, cache)
        for request in new:
            self._start_window(request)
        logits = self._prefill(new, cache)
        # begin_suppress_tokens guard a transcript's first token; after a forced prefix EOS may come at once
        first = torch.tensor([not r.window_prefix for r in new], dtype=torch.bool, device=logits.device)
        self._accept(new, self._sample(new, logits, first), deltas)

    def _detect_languages(self, new: list[SpeechRequest], cache) -> None:
        """One decoder step over <|startoftranscript|> for the new rows; kept where no language is known."""
        gen = self.runtime.generation
        if not gen.is_multilingual or all(r.language_id is not None for r in new):
            return
        ids = torch.full((len(new), 1), gen.decoder_start_token_id, device=self.runtime.device)
        start = torch.zeros(len(new), dtype=torch.long, device=self.runtime.device)
        detected = self.rules.detect_language(self.runtime.model.decoder(ids, start, cache)[:, -1])
        for request, language_id in zip(new, detected):
            if request.language_id is None:
                request.language_id = language_id

    def _start_window(self, request: SpeechRequest) -> None:
        request.prompt = decoder_prompt(self.runtime, request.language_id, request.params.task, request.previous,
                                        request.window_prefix)
        request.window_tokens = []
        request.max_tokens = max_window_tokens(self.runtime, len(request.prompt), request.params)
        request.detokenizer = Detokenizer(self.runtime.tokenizer, request.window_prefix)

    def _prefill(self, new: list[SpeechRequest], cache) -> torch.Tensor:
        """The new rows' prompts, right-padded, in one call -> logits [B, V] at each prompt's last token."""
        longest = max(len(r.prompt) for r in new)
        pad = self.runtime.generation.eos_token_id
        ids = torch.tensor([r.prompt + [pad] * (longest - len(r.prompt)) for r in new], device=self.runtime.device)
        start = torch.zeros(len(new), dtype=torch.long, device=self.runtime.device)
        logits = self.runtime.model.decoder(ids, start, cache)  # [B, T, V]
        last = torch.tensor([len(r.prompt) - 1 for r in new], device=logits.device)
        return logits[torch.arange(len(new), device=logits.device), last]

    def _sample(self, rows: list[SpeechRequest], logits: torch.Tensor, first: torch.Tensor) -> list[int]:
        temperatures = torch.tensor([r.params.temperature for r in rows], device=logits.device)
        return sample(self.rules.apply(logits, first), temperatures, self.generator)

    # -- tokens out -----------------------------------------------------------------------------------

    def _accept(self, rows: list[SpeechRequest], tokens: list[int], deltas: list[SpeechDelta]) -> None:
        ended = []
        for request, token in zip(rows, tokens):
            if token == self.runtime.generation.eos_token_id:
                ended.append(request)
                continue
            request.window_tokens.append(token)
            deltas.append(SpeechDelta(request.request_id, self._text(request, request.detokenizer.add(token)),
                                      [token]))
            if len(request.window_tokens) >= request.max_tokens:
                ended.append(request)
        for request in ended:
            self._end_window(request, deltas)

    def _text(self, request: SpeechRequest, text: str) -> str:
        """Released text, less the transcript's leading blanks (Whisper's text starts with a space)."""
        if not request.text_parts and not request.prefix:  # after a prefix the space separates it from the text
            text = text.lstrip()
        if text:
            request.text_parts.append(text)
        return text

    def _end_window(self, request: SpeechRequest, deltas: list[SpeechDelta]) -> None:
        self._free_row(self.rows.index(request))
        index = request.num_windows_done
        text = self._text(request, request.detokenizer.flush())
        tokens = request.window_tokens
        segment = Segment(index, index * request.window_s, min((index + 1) * request.window_s, request.duration_s),
                          self.runtime.tokenizer.decode(tokens), list(tokens))
        request.segments.append(segment)
        request.previous = carry_previous(self.runtime, request.previous, tokens)
        if request.num_windows_done < request.num_windows:
            request.move_to(Status.WAITING)
            self.waiting.appendleft(request)  # its next window goes first: requests finish in order
            deltas.append(SpeechDelta(request.request_id, text, segment=segment))
            return
        request.move_to(Status.FINISHED)
        del self.requests[request.request_id]
        deltas.append(SpeechDelta(request.request_id, text, segment=segment, finished=self._transcription(request)))

    def _transcription(self, request: SpeechRequest) -> Transcription:
        language = language_code(self.runtime.generation, request.language_id)
        return Transcription("".join(request.text_parts), request.token_ids, request.segments, language,
                             request.duration_s)

    def _free_row(self, index: int) -> None:
        """Drop row `index`, moving the last row into its slot so live rows stay contiguous."""
        last = len(self.rows) - 1
        if index != last:
            self.cache.move_row(last, index)
            self.rows[index] = self.rows[last]
        self.rows.pop()
