"""Turns one engine step's logits into one token per running sequence.

The order of work follows vLLM and Hugging Face: logit_bias, min_tokens masking,
repetition penalty, presence/frequency penalties, then temperature, top_k, top_p,
min_p and the draw. Greedy rows take the argmax after the penalties.

A seeded row draws only from its own generator, one draw of shape [V] per step,
and every filter is computed row by row (a row whose filter is off is left
bit-for-bit alone), so a seeded request gets the same tokens whatever else
shares its batch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import msgspec
import torch

from rill.sampling_params import SamplingParams
from rill.structured.bitmask import BitmaskFiller, apply_grammar
from rill.tokenizer.piece_index import PieceIndex

# exponential_ may return exactly 0; its log would be -inf and turn a banned
# token's -inf score into nan, which argmax prefers.
_MIN_NOISE = torch.finfo(torch.float32).tiny


@dataclass(slots=True)
class SamplingRow:
    """One running sequence as the sampler sees it."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None  # make_generator(params.seed), kept for the request's life
    matcher: Any = None  # params.grammar's matcher for this row (rill.structured)


class SampledToken(msgspec.Struct, frozen=True):
    """The chosen token; the logprob fields stay None unless the request asked for logprobs."""

    token_id: int
    logprob: float | None = None
    rank: int | None = None  # 1 = the model's most likely token
    top_logprobs: list[tuple[int, float]] | None = None


def make_generator(seed: int | None, device: torch.device | str | None = None) -> torch.Generator | None:
    """A request's own random stream, or None for an unseeded request (it shares the global one)."""
    if seed is None:
        return None
    generator = torch.Generator(device=device or "cpu")
    # manual_seed accepts [-2**63, 2**64); folding keeps every Python int valid.
    generator.manual_seed(seed % 2**64)
    return generator


class Sampler:
    """Batched sampling for the engine; one instance per model."""

    def __init__(self, eos_token_ids: Collection[int], vocab_size: int, pieces: PieceIndex | None = None):
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = vocab_size
        self.pieces = pieces  # each token's bytes, for output_prefix (None: it is not enforced)
        self._allowed: dict[bytes, list[int]] = {}  # output_prefix remainder -> the ids that agree with it
        self._bitmasks: BitmaskFiller | None = None  # made when the first constrained row arrives

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[SampledToken]:
        """logits: [S, >= vocab_size], any float dtype, one row per entry of rows."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sampling rows")
        logits = logits[:, : self.vocab_size]  # [S, V]: drop the embedding's padding columns
        if all(map(_is_plain_greedy, rows)):
            return [SampledToken(token_id) for token_id in logits.argmax(dim=-1).tolist()]
        token_ids = _choose(self.process(logits, rows), rows)
        return _sampled_tokens(logits, rows, token_ids)

    def process(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """A float32 copy [S, V] of logits after bias, min_tokens and penalties (before temperature)."""
        scores = logits[:, : self.vocab_size].to(torch.float32, copy=True)
        _apply_logit_bias(scores, rows)
        self._apply_min_tokens(scores, rows)
        _apply_repetition_penalty(scores, rows)
        _apply_presence_frequency_penalties(scores, rows)
        self._apply_output_prefix(scores, rows)
        self._apply_grammar(scores, rows)
        return scores

    def _apply_grammar(self, scores: torch.Tensor, rows: list[SamplingRow]) -> None:
        """Rows with a grammar keep only the tokens it allows next; the batch's bitmasks are filled together."""
        if self._bitmasks is None:
            if all(row.params.grammar is None for row in rows):
                return
            self._bitmasks = BitmaskFiller(self.vocab_size, self.eos_token_ids)
        apply_grammar(scores, rows, self._bitmasks)

    def _apply_min_tokens(self, scores: torch.Tensor, rows: list[SamplingRow]) -> None:
        # With ignore_eos the eos tokens end nothing, so banning them would only distort.
        row_ids, token_ids = [], []
        for i, row in enumerate(rows):
            params = row.params
            if len(row.output_token_ids) >= params.min_tokens:
                continue
            banned = [*params.stop_token_ids, *(() if params.ignore_eos else self.eos_token_ids)]
            banned = [t for t in banned if t < self.vocab_size]
            row_ids += [i] * len(banned)
            token_ids += banned
        if row_ids:
            scores[_index(row_ids, scores), _index(token_ids, scores)] = float("-inf")

    def _apply_output_prefix(self, scores: torch.Tensor, rows: list[SamplingRow]) -> None:
        """Rows whose output has not yet spelled its output_prefix keep only the tokens that agree with
        the rest of it; every other score becomes -inf."""
        if self.pieces is None:
            return
        for i, row in enumerate(rows):
            rest = self._prefix_rest(row)
            if rest:
                allowed = _index(self._allowed_ids(rest), scores)
                kept = scores[i, allowed]
                scores[i] = float("-inf")
                scores[i, allowed] = kept

    def _prefix_rest(self, row: SamplingRow) -> bytes:
        """The bytes of output_prefix the row's output has yet to write (b"": none, or no prefix)."""
        if row.params.output_prefix is None:
            return b""
        prefix = row.params.output_prefix.encode("utf-8")
        written = self.pieces.spelled(row.output_token_ids, len(prefix))
        return prefix[len(written):]

    def _allowed_ids(self, rest: bytes) -> list[int]:
        if rest not in self._allowed:
            if len(self._allowed) >= 4096:  # one entry per tool name and step: a bound, not an LRU
                self._allowed.clear()
            self._allowed[rest] = [t for t in self.pieces.consistent_ids(rest) if t < self.vocab_size]
        return self._allowed[rest]


def _is_plain_greedy(row: SamplingRow) -> bool:
    """True when the row's token is the raw argmax and it wants nothing else back."""
    params = row.params
    return (
        params.greedy
        and params.logprobs is None
        and params.logit_bias is None
        and params.output_prefix is None
        and params.grammar is None
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
        and len(row.output_token_ids) >= params.min_tokens
    )


def _index(values: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.long, device=like.device)


def _apply_logit_bias(scores: torch.Tensor, rows: list[SamplingRow]) -> None:
    # Ids past the vocabulary cannot be sampled; SamplingParams.check_vocab rejects them at
    # submission, and skipping a stray one here keeps it from failing the whole step.
    vocab_size = scores.shape[-1]
    row_ids, token_ids, biases = [], [], []
    for i, row in enumerate(rows):
        for token_id, bias in (row.params.logit_bias or {}).items():
            if token_id < vocab_size:
                row_ids.append(i)
                token_ids.append(token_id)
                biases.append(bias)
    if row_ids:
        where = (_index(row_ids, scores), _index(token_ids, scores))
        scores.index_put_(where, torch.tensor(biases, device=scores.device), accumulate=True)


def _apply_repetition_penalty(scores: torch.Tensor, rows: list[SamplingRow]) -> None:
    """Hugging Face's rule over prompt and output tokens: divide positive logits, multiply negative."""
    active = [i for i, row in enumerate(rows) if row.params.repetition_penalty != 1.0]
    if not active:
        return
    seen = torch.zeros(len(active), scores.shape[-1], dtype=torch.bool, device=scores.device)
    token_lists = [[*rows[i].prompt_token_ids, *rows[i].output_token_ids] for i in active]
    seen[_token_pairs(token_lists, scores)] = True
    penalty = torch.tensor([rows[i].params.repetition_penalty for i in active], device=scores.device)
    penalty = penalty[:, None]
    idx = _index(active, scores)
    sub = scores[idx]
    penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
    scores[idx] = torch.where(seen, penalised, sub)


def _apply_presence_frequency_penalties(scores: torch.Tensor, rows: list[SamplingRow]) -> None:
    """OpenAI's rule over output tokens only: score -= count * frequency + (count > 0) * presence."""
    active = [
        i
        for i, row in enumerate(rows)
        if (row.params.presence_penalty or row.params.frequency_penalty) and row.output_token_ids
    ]
    if not active:
        return
    counts = torch.zeros(len(active), scores.shape[-1], device=scores.device)
    pairs = _token_pairs([rows[i].output_token_ids for i in active], scores)
    counts.index_put_(pairs, torch.ones(len(pairs[0]), device=scores.device), accumulate=True)
    presence = torch.tensor([rows[i].params.presence_penalty for i in active], device=scores.device)
    frequency = torch.tensor([rows[i].params.frequency_penalty for i in active], device=scores.device)
    idx = _index(active, scores)
    scores[idx] -= counts * frequency[:, None] + (counts > 0) * presence[:, None]


def _token_pairs(token_lists: list[Sequence[int]], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) index tensors [N] for every token of every list, built once, not per row."""
    lengths = _index([len(tokens) for tokens in token_lists], like)
    row_ids = torch.repeat_interleave(torch.arange(len(token_lists), device=like.device), lengths)
    return row_ids, _index(list(chain.from_iterable(token_lists)), like)


def _choose(scores: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Token ids [S]: the argmax for greedy rows, a draw for the rest."""
    token_ids = scores.argmax(dim=-1)
    random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
    if random_rows:
        idx = _index(random_rows, scores)
        token_ids[idx] = _sample(scores[idx], [rows[i] for i in random_rows])
    return token_ids


def _sample(scores: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """One draw per row [R] from softmax(scores / temperature) after top_k, top_p and min_p."""
    params = [row.params for row in rows]
    temperature = torch.tensor([p.temperature for p in params], device=scores.device)
    scores /= temperature[:, None]
    _apply_top_k_top_p(scores, params)
    _apply_min_p(scores, params)
    # Exponential race: argmax(probs / E) with E ~ Exp(1) is a draw from probs. In log
    # space it is argmax(scores - log E); softmax's normaliser is the same for every token.
    noise = _exponential_noise(rows, scores)
    return (scores - noise.log()).argmax(dim=-1)


def _apply_top_k_top_p(scores: torch.Tensor, params: list[SamplingParams]) -> None:
    """Keep each row's top_k best tokens, then the fewest whose probability reaches top_p."""
    vocab_size = scores.shape[-1]
    active = [i for i, p in enumerate(params) if (p.top_k or vocab_size) < vocab_size or p.top_p < 1.0]
    if not active:
        return
    top_k = _index([min(params[i].top_k or vocab_size, vocab_size) for i in active], scores)
    top_p = torch.tensor([params[i].top_p for i in active], device=scores.device)
    idx = _index(active, scores)
    sub = scores[idx]
    # Stable, so tied tokens keep vocabulary order and top_k=1 agrees with argmax.
    sorted_scores, order = sub.sort(dim=-1, descending=True, stable=True)
    positions = torch.arange(vocab_size, device=scores.device)
    sorted_scores.masked_fill_(positions >= top_k[:, None], float("-inf"))
    probs = sorted_scores.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p == 1 must cut nothing, even where float rounding lets the cumsum reach 1 early.
    cut = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    sorted_scores.masked_fill_(cut, float("-inf"))
    scores[idx] = sub.scatter_(-1, order, sorted_scores)


def _apply_min_p(scores: torch.Tensor, params: list[SamplingParams]) -> None:
    """Drop tokens whose probability is below min_p times the top token's."""
    active = [i for i, p in enumerate(params) if p.min_p > 0.0]
    if not active:
        return
    min_p = torch.tensor([params[i].min_p for i in active], device=scores.device)
    idx = _index(active, scores)
    sub = scores[idx]
    # p_i < min_p * p_max  <=>  s_i < s_max + log(min_p): the normaliser cancels, so it
    # does not matter that top_k / top_p have already renormalised.
    threshold = sub.max(dim=-1, keepdim=True).values + min_p.log()[:, None]
    scores[idx] = sub.masked_fill_(sub < threshold, float("-inf"))


def _exponential_noise(rows: list[SamplingRow], scores: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise [R, V]: unseeded rows share one draw, each seeded row draws [V] alone."""
    num_rows, vocab_size = scores.shape
    noise = torch.empty(num_rows, vocab_size, device=scores.device)
    unseeded = [i for i, row in enumerate(rows) if row.generator is None]
    if len(unseeded) == num_rows:
        noise.exponential_()
    elif unseeded:
        noise[_index(unseeded, scores)] = noise.new_empty(len(unseeded), vocab_size).exponential_()
    for i, row in enumerate(rows):
        if row.generator is not None:
            # Drawn on the generator's device; the copy moves it to the logits' device if they differ.
            draw = torch.empty(vocab_size, device=row.generator.device)
            noise[i] = draw.exponential_(generator=row.generator)
    return noise.clamp_min_(_MIN_NOISE)


def _sampled_tokens(
    logits: torch.Tensor, rows: list[SamplingRow], token_ids: torch.Tensor
) -> list[SampledToken]:
    """Attach logprobs from the raw logits (the model's own distribution, vLLM's default)."""
    ids = token_ids.tolist()
    tokens = [SampledToken(token_id) for token_id in ids]
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return tokens
    idx = _index(wanted, logits)
    logprobs = logits[idx].float().log_softmax(dim=-1)  # [W, V]
    chosen = logprobs.gather(1, token_ids[idx][:, None])  # [W, 1]
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    max_k = min(max(rows[i].params.logprobs for i in wanted), logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(max_k, dim=-1)
    top_values, top_ids, chosen = top_values.tolist(), top_ids.tolist(), chosen[:, 0].tolist()
    for j, i in enumerate(wanted):
        k = rows[i].params.logprobs
        top = list(zip(top_ids[j][:k], top_values[j][:k]))
        tokens[i] = SampledToken(ids[i], logprob=chosen[j], rank=ranks[j], top_logprobs=top)
    return tokens
