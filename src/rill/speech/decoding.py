"""Whisper's decoding rules, as transformers' `generate` and OpenAI's whisper apply them.

The decoder prompt of a window is `[<|startofprev|> previous text] <|startoftranscript|> [<|lang|> <|task|>]
<|notimestamps|>` (English-only models have no language or task token). The previous text is the caller's
prompt and the text of the windows before, cut to its last `max_target_positions // 2 - 1` tokens as
Whisper cuts it. `suppress_tokens` never come out; `begin_suppress_tokens` (a space, EOS) not first. A
multilingual model given no language reads it from one decoder step over <|startoftranscript|>: the
likeliest language token. A window ends at EOS or when prompt plus output fill `max_target_positions`.
"""

from __future__ import annotations

import msgspec
import numpy as np
import torch

from rill.errors import ValidationError
from rill.speech.whisper import WhisperGenerationConfig, WhisperRuntime

TASKS = ("transcribe", "translate")


class TranscribeParams(msgspec.Struct, frozen=True):
    language: str | None = None  # ISO code ("en"); None: detected (multilingual models), else "en"
    prompt: str | None = None  # previous-text prompt (<|startofprev|>)
    temperature: float = 0.0
    task: str = "transcribe"
    max_new_tokens: int | None = None  # per window
    # Text forced after the special tokens of the first window, as the model writes it (leading space
    # included); the output is what follows it (OpenAI whisper's `prefix`). Streaming recognition
    # (rill.speech.live) forces the words it has committed, so a pass only decodes the words after them.
    prefix: str | None = None


class Segment(msgspec.Struct):
    """One window's text (no timestamps: start/end are the window's bounds in seconds)."""

    id: int
    start: float
    end: float
    text: str
    token_ids: list[int]


class Transcription(msgspec.Struct):
    text: str
    token_ids: list[int]
    segments: list[Segment]
    language: str
    duration_s: float


class SpeechDelta(msgspec.Struct):
    """What one engine step gives one request."""

    request_id: str
    text: str = ""
    token_ids: list[int] = msgspec.field(default_factory=list)
    segment: Segment | None = None
    finished: Transcription | None = None
    error: str | None = None


# -- prompt ---------------------------------------------------------------------------------------------


def language_token_id(gen: WhisperGenerationConfig, language: str | None) -> int | None:
    """The <|lang|> id to force, or None to detect; English-only models take only "en" (and no token)."""
    if language is None:
        return None
    code = language.strip().lower().removeprefix("<|").removesuffix("|>")
    if not gen.is_multilingual:
        if code != "en":
            raise ValidationError(f"this model is English-only; language {language!r} is not supported",
                                  param="language")
        return None
    token = gen.lang_to_id.get(f"<|{code}|>")
    if token is None:
        known = ", ".join(sorted(t.strip("<|>") for t in gen.lang_to_id))
        raise ValidationError(f"language {language!r} is not supported by this model (supported: {known})",
                              param="language")
    return token


def validate_params(gen: WhisperGenerationConfig, params: TranscribeParams) -> None:
    """Raise ValidationError for parameters the model cannot honour (cheap: no model run)."""
    language_token_id(gen, params.language)
    if params.task not in TASKS:
        raise ValidationError(f"task must be one of {', '.join(TASKS)}", param="task")
    if params.task != "transcribe" and params.task not in gen.task_to_id:
        raise ValidationError(f"this model does not {params.task}", param="task")
    if not 0.0 <= params.temperature <= 2.0:
        raise ValidationError("temperature must be between 0 and 2", param="temperature")
    if params.max_new_tokens is not None and params.max_new_tokens < 1:
        raise ValidationError("max_new_tokens must be at least 1", param="max_new_tokens")
    if params.prefix is not None and "<|" in params.prefix:
        raise ValidationError("a prefix is text, not special tokens", param="prefix")


def language_code(gen: WhisperGenerationConfig, token_id: int | None) -> str:
    for token, i in gen.lang_to_id.items():
        if i == token_id:
            return token.strip("<|>")
    return "en"


def text_ids(runtime: WhisperRuntime, text: str | None) -> list[int]:
    """A prompt's ids as WhisperTokenizer.get_prompt_ids encodes them (" " + the stripped text)."""
    if not text or not text.strip():
        return []
    return runtime.tokenizer.encode(" " + text.strip(), add_special_tokens=False)


def decoder_prompt(runtime: WhisperRuntime, language_id: int | None, task: str, previous: list[int],
                   prefix: list[int] = ()) -> list[int]:
    """The special-token prompt of one window, after the previous text (cut as Whisper cuts it), and
    the forced `prefix` ids after the special tokens."""
    gen = runtime.generation
    start = [gen.decoder_start_token_id]
    if gen.is_multilingual:
        start += [language_id, gen.task_to_id.get(task, gen.task_to_id.get("transcribe"))]
    if gen.no_timestamps_token_id is not None:
        start.append(gen.no_timestamps_token_id)
    start = [t for t in start if t is not None] + list(prefix)
    max_target = runtime.config.max_target_positions
    keep = min(max_target // 2 - 1, max_target - len(start) - 2)  # leave room for one token
    if not previous or keep <= 0 or gen.prev_sot_token_id is None:
        return start
    return [gen.prev_sot_token_id, *previous[-keep:], *start]


def prefix_ids(runtime: WhisperRuntime, prefix: str | None) -> list[int]:
    """A forced prefix's ids, the text encoded as given (no space added, nothing stripped)."""
    return runtime.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []


def carry_previous(runtime: WhisperRuntime, previous: list[int], window_tokens: list[int]) -> list[int]:
    """The next window's previous text: this one's appended, special tokens (a language token the model
    emitted) left out, as a <|startofprev|> prompt holds text only."""
    return previous + [t for t in window_tokens if t not in runtime.special_ids]


def max_window_tokens(runtime: WhisperRuntime, prompt_len: int, params: TranscribeParams) -> int:
    """How many tokens (EOS included) a window may produce: the decoder's positions, or max_new_tokens."""
    room = runtime.config.max_target_positions - prompt_len
    return room if params.max_new_tokens is None else min(room, params.max_new_tokens)


# -- logits ---------------------------------------------------------------------------------------------


class LogitRules:
    """suppress_tokens at every step, begin_suppress_tokens at a window's first step, for rows together."""

    def __init__(self, gen: WhisperGenerationConfig, vocab_size: int, device):
        self.always = self._mask(gen.suppress_tokens, vocab_size, device)
        self.first = self._mask(gen.begin_suppress_tokens, vocab_size, device) | self.always
        self.language_ids = torch.tensor(sorted(gen.lang_to_id.values()), dtype=torch.long, device=device)

    @staticmethod
    def _mask(ids, vocab_size: int, device) -> torch.Tensor:
        mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        ids = [i for i in ids if 0 <= i < vocab_size]  # transformers ignores ids beyond the vocabulary
        mask[ids] = True
        return mask

    def apply(self, logits: torch.Tensor, first_step: torch.Tensor) -> torch.Tensor:
        """logits [B, V]; first_step [B] bool -> logits with the suppressed ids at -inf."""
        masks = torch.where(first_step[:, None], self.first, self.always)
        return logits.masked_fill(masks, float("-inf"))

    def detect_language(self, logits: torch.Tensor) -> list[int]:
        """logits [B, V] after <|startoftranscript|> -> the likeliest language token of each row."""
        return self.language_ids[logits[:, self.language_ids].argmax(-1)].tolist()


def sample(logits: torch.Tensor, temperatures: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """logits [B, V], temperatures [B]: argmax where 0, else a draw from softmax(logits / T)."""
    greedy = logits.argmax(-1)
    hot = temperatures > 0
    if not bool(hot.any()):
        return greedy.tolist()
    probs = torch.softmax(logits[hot] / temperatures[hot, None], dim=-1)
    greedy[hot] = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return greedy.tolist()


# -- audio windows --------------------------------------------------------------------------------------


def split_windows(audio: np.ndarray, window_samples: int) -> list[np.ndarray]:
    """Cut 16 kHz audio into windows of the model's length (the last one shorter; at least one)."""
    n = max(1, -(-len(audio) // window_samples))
    return [audio[i * window_samples : (i + 1) * window_samples] for i in range(n)]


# -- one request, one window at a time (the reference the batched core is tested against) ---------------


@torch.inference_mode()
def decode_window(runtime: WhisperRuntime, features: torch.Tensor, params: TranscribeParams,
                  previous: list[int] = (), language_id: int | None = None) -> tuple[list[int], int | None]:
    """Greedy/sampled decoding of one window's features [1, mel, frames] with batch 1 and no engine.

    Returns the window's output ids (EOS dropped) and the language token used (detected when the model
    is multilingual and neither params nor language_id give one).
    """
    gen = runtime.generation
    rules = LogitRules(gen, runtime.config.vocab_size, runtime.device)
    cache = runtime.new_cache(1)
    runtime.model.encode_into(features.to(runtime.device), cache)
    if language_id is None:
        language_id = language_token_id(gen, params.language)
    if language_id is None and gen.is_multilingual:
        logits = _step(runtime, [[gen.decoder_start_token_id]], 0, cache)
        language_id = rules.detect_language(logits)[0]
    forced = prefix_ids(runtime, params.prefix)
    prompt = decoder_prompt(runtime, language_id, params.task, list(previous), forced)
    limit = max_window_tokens(runtime, len(prompt), params)
    logits, out = _step(runtime, [prompt], 0, cache), []
    temperature = torch.tensor([params.temperature], device=runtime.device)
    while True:
        first = torch.tensor([not out and not forced], device=runtime.device)  # begin-suppress: the transcript's start
        token = sample(rules.apply(logits, first), temperature, None)[0]
        if token == gen.eos_token_id:
            break
        out.append(token)
        if len(out) >= limit:
            break
        logits = _step(runtime, [[token]], len(prompt) + len(out) - 1, cache)
    return out, language_id


def _step(runtime: WhisperRuntime, ids: list[list[int]], start: int, cache) -> torch.Tensor:
    ids_t = torch.tensor(ids, device=runtime.device)
    start_t = torch.full((len(ids),), start, device=runtime.device)
    return runtime.model.decoder(ids_t, start_t, cache)[:, -1]
