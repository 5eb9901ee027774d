"""Sampler: every rule checked against a direct computation on small, hand-made or seeded logits."""

from __future__ import annotations

import math

import pytest
import torch

from rill.engine.sampler import SampledToken, Sampler, SamplingRow, make_generator
from rill.sampling_params import SamplingParams

EOS = 2
VOCAB = 50


def make_row(prompt=(), output=(), **params) -> SamplingRow:
    sampling = SamplingParams(**params)
    return SamplingRow(sampling, list(prompt), list(output), make_generator(sampling.seed))


def token_ids(tokens: list[SampledToken]) -> list[int]:
    return [t.token_id for t in tokens]


@pytest.fixture
def sampler() -> Sampler:
    return Sampler(eos_token_ids=[EOS], vocab_size=VOCAB)


@pytest.fixture(autouse=True)
def fixed_global_seed():
    # Unseeded rows share torch's global generator; fix it so the statistical tests are repeatable.
    torch.manual_seed(0)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def draw_counts(sampler: Sampler, logits_row: torch.Tensor, num_draws: int, **params) -> torch.Tensor:
    rows = [make_row(**params) for _ in range(num_draws)]
    drawn = token_ids(sampler(logits_row.expand(num_draws, -1), rows))
    return torch.bincount(torch.tensor(drawn), minlength=logits_row.shape[-1]).double()


# -- greedy and the fast path -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_all_greedy_batch_takes_the_argmax_of_each_row(sampler, dtype):
    logits = torch.randn(256, VOCAB, dtype=dtype)
    out = sampler(logits, [make_row(temperature=0) for _ in range(256)])
    assert token_ids(out) == logits.argmax(dim=-1).tolist()
    assert all(t.logprob is None and t.rank is None and t.top_logprobs is None for t in out)


def test_plain_greedy_batch_skips_logit_processing(sampler, monkeypatch):
    def fail(*args):
        raise AssertionError("the all-greedy fast path must be a single argmax")

    monkeypatch.setattr(Sampler, "process", fail)
    logits = torch.randn(8, VOCAB)
    rows = [make_row(temperature=0, seed=i) for i in range(8)]
    assert token_ids(sampler(logits, rows)) == logits.argmax(-1).tolist()


def test_greedy_rows_beside_random_rows_still_take_the_argmax(sampler):
    logits = torch.randn(32, VOCAB)
    rows = [make_row(temperature=0 if i % 2 else 1.0, top_k=5) for i in range(32)]
    out = token_ids(sampler(logits, rows))
    assert out[1::2] == logits[1::2].argmax(-1).tolist()


def test_padding_columns_past_vocab_size_are_never_chosen(sampler):
    logits = torch.randn(16, VOCAB + 14)
    logits[:, VOCAB:] = 1e4
    greedy = sampler(logits[:8], [make_row(temperature=0) for _ in range(8)])
    sampled = sampler(logits[8:], [make_row(temperature=1.0) for _ in range(8)])
    assert all(t < VOCAB for t in token_ids(greedy) + token_ids(sampled))


def test_input_logits_are_left_unchanged(sampler):
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    params = dict(temperature=0.5, top_p=0.5, min_p=0.1, repetition_penalty=1.5, presence_penalty=1.0,
                  logit_bias={4: 5.0}, logprobs=2)
    rows = [make_row(prompt=[1, 2], output=[3], **params) for _ in range(4)]
    sampler(logits, rows)
    assert torch.equal(logits, before)


def test_row_count_must_match_logits(sampler):
    with pytest.raises(ValueError):
        sampler(torch.randn(3, VOCAB), [make_row(temperature=0)] * 2)


# -- filters against a direct computation ---------------------------------------------------


def test_top_k_1_equals_greedy(sampler):
    logits = torch.randn(64, VOCAB) * 3
    rows = [make_row(top_k=1) for _ in range(64)]
    assert token_ids(sampler(logits, rows)) == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy(sampler):
    logits = torch.randn(64, VOCAB) * 3
    rows = [make_row(top_p=1e-6) for _ in range(64)]
    assert token_ids(sampler(logits, rows)) == logits.argmax(-1).tolist()


def test_ties_resolve_to_the_lowest_token_id_like_argmax(sampler):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0] + [-10.0] * (VOCAB - 4)])
    assert token_ids(sampler(logits, [make_row(top_k=1)])) == [1]
    assert token_ids(sampler(logits, [make_row(top_p=1e-6)])) == [1]
    assert token_ids(sampler(logits, [make_row(temperature=0, presence_penalty=0.5)])) == [1]


def reference_probs(logits_row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The filtered distribution, one plain step at a time in float64 (HF's warper order)."""
    probs = (logits_row.double() / params.temperature).softmax(-1)
    order = sorted(range(len(probs)), key=lambda t: -probs[t].item())
    kept = order[: params.top_k or len(order)]
    renormalised = probs[kept] / probs[kept].sum()
    mass, nucleus = 0.0, []
    for token, p in zip(kept, renormalised.tolist()):
        if params.top_p < 1.0 and mass >= params.top_p:
            break
        nucleus.append(token)
        mass += p
    final = [t for t in nucleus if probs[t] >= params.min_p * probs[order[0]]]
    out = torch.zeros_like(probs)
    out[final] = probs[final]
    return out / out.sum()


FILTER_CASES = [
    dict(temperature=1.0),
    dict(temperature=0.3),
    dict(temperature=2.5),
    dict(top_k=5),
    dict(top_p=0.6),
    dict(min_p=0.2),
    dict(temperature=0.7, top_k=10, top_p=0.8, min_p=0.05),
]


@pytest.mark.parametrize("params", FILTER_CASES, ids=[str(p) for p in FILTER_CASES])
def test_seeded_draw_is_the_exponential_race_over_the_filtered_distribution(sampler, params):
    logits = torch.randn(100, VOCAB) * 2
    rows = [make_row(seed=seed, **params) for seed in range(100)]
    out = token_ids(sampler(logits, rows))
    for seed, (logits_row, row) in enumerate(zip(logits, rows)):
        probs = reference_probs(logits_row, row.params)
        noise = torch.empty(VOCAB).exponential_(generator=make_generator(seed)).double()
        assert probs[out[seed]] > 0
        assert out[seed] == int((probs / noise).argmax())


def test_top_k_samples_only_the_k_best_in_proportion(sampler):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])
    counts = draw_counts(Sampler([], 6), logits, 20_000, top_k=3)
    assert counts[[3, 4]].sum() == 0
    kept = torch.tensor([0, 1, 5])
    expected = torch.zeros(6, dtype=torch.double)
    expected[kept] = logits[kept].double().softmax(-1)
    assert chi_square(counts, expected) < 13.8  # df 2, p = 0.001


def test_top_p_keeps_the_fewest_tokens_reaching_p(sampler):
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    counts = draw_counts(Sampler([], 4), logits, 20_000, top_p=0.7)
    assert counts[2:].sum() == 0
    assert chi_square(counts, torch.tensor([0.625, 0.375, 0, 0], dtype=torch.double)) < 10.8  # df 1
    counts = draw_counts(Sampler([], 4), logits, 20_000, top_p=0.85)
    assert counts[3] == 0 and counts[2] > 0


def test_min_p_drops_tokens_below_its_fraction_of_the_top_probability(sampler):
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    counts = draw_counts(Sampler([], 4), logits, 20_000, min_p=0.2)  # threshold 0.1
    assert counts[3] == 0
    expected = torch.tensor([0.5, 0.3, 0.15, 0], dtype=torch.double) / 0.95
    assert chi_square(counts, expected) < 13.8  # df 2


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_unseeded_draws_follow_softmax_of_logits_over_temperature(temperature):
    logits = torch.randn(8) * 1.5
    counts = draw_counts(Sampler([], 8), logits, 20_000, temperature=temperature)
    assert chi_square(counts, (logits.double() / temperature).softmax(-1)) < 24.3  # df 7, p = 0.001


def test_seeded_draws_across_many_seeds_follow_the_distribution():
    logits = torch.randn(8)
    rows = [make_row(seed=seed) for seed in range(10_000)]
    drawn = token_ids(Sampler([], 8)(logits.expand(len(rows), -1), rows))
    counts = torch.bincount(torch.tensor(drawn), minlength=8).double()
    assert chi_square(counts, logits.double().softmax(-1)) < 24.3


# -- logit processing against hand-made values ------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits(sampler):
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0] + [0.0] * (VOCAB - 5)])
    row = make_row(prompt=[0, 0], output=[1, 3], repetition_penalty=2.0)
    scores = sampler.process(logits, [row])[0, :5]
    assert scores.tolist() == [1.0, -2.0, 0.5, 1.5, 1.0]


def test_repetition_penalty_matches_hugging_face_rule_on_random_rows(sampler):
    logits = torch.randn(6, VOCAB)
    rows = [
        make_row(prompt=torch.randint(0, VOCAB, (20,)).tolist(), output=torch.randint(0, VOCAB, (5,)).tolist(),
                 repetition_penalty=penalty)
        for penalty in (0.5, 0.9, 1.0, 1.1, 1.5, 3.0)
    ]
    scores = sampler.process(logits, rows)
    for i, row in enumerate(rows):
        expected = logits[i].clone()
        for token in set(row.prompt_token_ids) | set(row.output_token_ids):
            x, penalty = expected[token], row.params.repetition_penalty
            expected[token] = x / penalty if x > 0 else x * penalty
        assert torch.allclose(scores[i], expected)


def test_presence_and_frequency_penalties_count_output_tokens_only(sampler):
    logits = torch.zeros(1, VOCAB)
    row = make_row(prompt=[5, 5], output=[1, 1, 2], presence_penalty=0.5, frequency_penalty=0.25)
    scores = sampler.process(logits, [row])[0]
    assert scores[:6].tolist() == [0.0, -1.0, -0.75, 0.0, 0.0, 0.0]


def test_negative_penalties_encourage_repeats(sampler):
    row = make_row(output=[7], presence_penalty=-2.0, frequency_penalty=-1.0)
    assert sampler.process(torch.zeros(1, VOCAB), [row])[0, 7] == 3.0


def test_logit_bias_is_applied_before_the_repetition_penalty(sampler):
    row = make_row(prompt=[0], logit_bias={0: 2.0}, repetition_penalty=2.0)
    assert sampler.process(torch.zeros(1, VOCAB), [row])[0, 0] == 1.0  # (0 + 2) / 2, not 0 / 2 + 2


def test_logit_bias_forces_and_bans_tokens(sampler):
    logits = torch.randn(4, VOCAB)
    forced = [make_row(temperature=t, logit_bias={9: 100.0}) for t in (0, 0.7, 1.0, 1.5)]
    assert token_ids(sampler(logits, forced)) == [9, 9, 9, 9]
    top = int(logits[0].argmax())
    banned = make_row(temperature=0, logit_bias={top: -100.0})
    assert token_ids(sampler(logits[:1], [banned])) == [int(logits[0].topk(2).indices[1])]


def test_logit_bias_outside_the_vocabulary_is_ignored(sampler):
    logits = torch.randn(1, VOCAB)
    row = make_row(temperature=0, logit_bias={VOCAB + 5: 100.0})
    assert token_ids(sampler(logits, [row])) == [int(logits.argmax())]


def test_min_tokens_blocks_eos_and_stop_token_ids_until_reached(sampler):
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 7], logits[0, 11] = 10.0, 9.0, 8.0
    early = make_row(temperature=0, min_tokens=3, output=[4, 4], stop_token_ids=[7])
    assert token_ids(sampler(logits, [early])) == [11]
    scores = sampler.process(logits, [early])[0]
    assert scores[EOS] == -math.inf and scores[7] == -math.inf
    reached = make_row(temperature=0, min_tokens=3, output=[4, 4, 4], stop_token_ids=[7])
    assert token_ids(sampler(logits, [reached])) == [EOS]


def test_min_tokens_blocks_eos_in_every_sampled_draw(sampler):
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS] = 5.0
    counts = draw_counts(sampler, logits[0], 2_000, min_tokens=1)
    assert counts[EOS] == 0


def test_min_tokens_leaves_eos_alone_when_eos_is_ignored(sampler):
    row = make_row(min_tokens=5, ignore_eos=True, stop_token_ids=[7])
    scores = sampler.process(torch.zeros(1, VOCAB), [row])[0]
    assert scores[EOS] == 0.0 and scores[7] == -math.inf


# -- seeds -------------------------------------------------------------------------------------


def decode_steps(sampler: Sampler, target: SamplingRow, target_logits: torch.Tensor,
                 others: list[SamplingRow], position: int) -> list[int]:
    """Run len(target_logits) steps with target at `position` among others; return target's tokens."""
    for step_logits in target_logits:
        rows = others[:position] + [target] + others[position:]
        logits = torch.randn(len(rows), target_logits.shape[-1], device=target_logits.device) * 2
        logits[position] = step_logits
        for row, token in zip(rows, token_ids(sampler(logits, rows))):
            row.output_token_ids.append(token)
    return target.output_token_ids


def seeded_target() -> SamplingRow:
    return make_row(prompt=[1, 2, 3], seed=1234, temperature=0.9, top_p=0.95, presence_penalty=0.3)


def mixed_neighbours(count: int) -> list[SamplingRow]:
    kinds = [
        dict(seed=7), dict(), dict(temperature=0), dict(top_k=3, seed=99), dict(min_p=0.3),
        dict(temperature=0, repetition_penalty=1.3), dict(logprobs=3, top_p=0.5),
        dict(logit_bias={4: 3.0}),
    ]
    return [make_row(prompt=[5], **kinds[i % len(kinds)]) for i in range(count)]


@pytest.mark.parametrize("neighbours", ["seeded", "unseeded", "mixed"])
def test_seeded_row_gives_the_same_tokens_alone_and_in_a_batch_of_32(sampler, neighbours):
    target_logits = torch.randn(20, VOCAB) * 2
    alone = decode_steps(sampler, seeded_target(), target_logits, [], position=0)
    if neighbours == "seeded":
        others = [make_row(seed=s, top_k=10) for s in range(31)]
    elif neighbours == "unseeded":
        others = [make_row(temperature=1.3) for _ in range(31)]
    else:
        others = mixed_neighbours(31)
    batched = decode_steps(sampler, seeded_target(), target_logits, others, position=17)
    assert batched == alone


def test_two_requests_with_the_same_seed_draw_the_same_tokens(sampler):
    logits = torch.randn(1, VOCAB).expand(2, -1)
    first, second = make_row(seed=5), make_row(seed=5)
    steps = [token_ids(sampler(logits, [first, second])) for _ in range(20)]
    assert all(a == b for a, b in steps)


def test_different_seeds_draw_different_sequences(sampler):
    logits = torch.zeros(1, VOCAB)  # uniform: 20 draws from 50 tokens all matching is ~1e-34
    a, b = make_row(seed=1), make_row(seed=2)
    draws = lambda row: [token_ids(sampler(logits, [row])) for _ in range(20)]  # noqa: E731
    assert draws(a) != draws(b)


def test_make_generator_accepts_any_python_int():
    assert make_generator(None) is None
    for seed in (0, -1, 2**63, 2**70):
        assert isinstance(make_generator(seed), torch.Generator)
    draw = lambda seed: torch.rand(4, generator=make_generator(seed))  # noqa: E731
    assert torch.equal(draw(42), draw(42))


# -- logprobs ----------------------------------------------------------------------------------


def test_logprobs_come_from_the_raw_logits_whatever_the_processing(sampler):
    logits = torch.randn(3, VOCAB)
    rows = [
        make_row(logprobs=5, temperature=0.3, top_k=4, repetition_penalty=2.0, prompt=[1, 2, 3]),
        make_row(logprobs=20, temperature=0, presence_penalty=1.0, output=[0, 1]),
        make_row(logprobs=3, seed=3, logit_bias={11: 50.0}),
    ]
    out = sampler(logits, rows)
    raw = logits.log_softmax(-1)
    for i, token in enumerate(out):
        k = rows[i].params.logprobs
        assert token.logprob == pytest.approx(raw[i, token.token_id].item(), abs=1e-6)
        assert token.rank == 1 + int((raw[i] > raw[i, token.token_id]).sum())
        values, ids = raw[i].topk(k)
        assert [t for t, _ in token.top_logprobs] == ids.tolist()
        assert [lp for _, lp in token.top_logprobs] == pytest.approx(values.tolist(), abs=1e-6)
    assert out[2].token_id == 11


def test_greedy_token_has_rank_1(sampler):
    logits = torch.randn(4, VOCAB)
    out = sampler(logits, [make_row(temperature=0, logprobs=1) for _ in range(4)])
    assert [t.rank for t in out] == [1, 1, 1, 1]
    assert [t.top_logprobs[0][0] for t in out] == token_ids(out)


def test_logprobs_0_returns_the_sampled_token_only(sampler):
    out = sampler(torch.randn(2, VOCAB), [make_row(logprobs=0), make_row()])
    assert out[0].top_logprobs == [] and out[0].logprob is not None and out[0].rank is not None
    assert out[1] == SampledToken(out[1].token_id)


def test_logprobs_for_half_precision_logits_are_float32_accurate(sampler):
    logits = torch.randn(1, VOCAB, dtype=torch.bfloat16)
    token = sampler(logits, [make_row(temperature=0, logprobs=2)])[0]
    assert token.logprob == pytest.approx(logits.float().log_softmax(-1).max().item(), abs=1e-6)


# -- on a CUDA device, when there is one ----------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_cuda_seeded_row_gives_the_same_tokens_alone_and_in_a_batch(generator_device):
    sampler = Sampler([EOS], vocab_size=32_000)
    target_logits = torch.randn(16, 32_000, device="cuda") * 2

    def target():
        row = seeded_target()
        row.generator = make_generator(row.params.seed, device=generator_device)
        return row

    alone = decode_steps(sampler, target(), target_logits, [], position=0)
    batched = decode_steps(sampler, target(), target_logits, mixed_neighbours(255), position=100)
    assert batched == alone


@needs_cuda
def test_cuda_seeded_draw_is_the_exponential_race_over_the_filtered_distribution():
    sampler = Sampler([EOS], vocab_size=VOCAB)
    params = dict(temperature=0.7, top_k=10, top_p=0.8, min_p=0.05)
    logits = torch.randn(64, VOCAB) * 2
    rows = [make_row(**params) for _ in range(64)]
    for seed, row in enumerate(rows):
        row.generator = make_generator(seed, device="cuda")
    out = token_ids(sampler(logits.cuda(), rows))
    for seed, (logits_row, row) in enumerate(zip(logits, rows)):
        probs = reference_probs(logits_row, row.params)
        noise = torch.empty(VOCAB, device="cuda").exponential_(generator=make_generator(seed, "cuda"))
        assert out[seed] == int((probs / noise.cpu().double()).argmax())


@needs_cuda
def test_cuda_processing_greedy_and_logprobs_match_cpu():
    sampler = Sampler([EOS], vocab_size=VOCAB)
    logits = torch.randn(6, VOCAB + 14)
    rows = [
        make_row(temperature=0, logprobs=4, prompt=[1, 2, 3], output=[3, 9], repetition_penalty=1.3),
        make_row(temperature=0, presence_penalty=0.7, frequency_penalty=-0.4, output=[5, 5, 6]),
        make_row(temperature=0, logit_bias={8: 3.0, 60: 1.0}, logprobs=0),
        make_row(temperature=0, min_tokens=4, output=[1], stop_token_ids=[7]),
        make_row(temperature=0),
        make_row(temperature=0, logprobs=20, repetition_penalty=0.8, prompt=list(range(30))),
    ]
    on_cpu, on_cuda = sampler(logits, rows), sampler(logits.cuda(), rows)
    assert torch.allclose(sampler.process(logits, rows), sampler.process(logits.cuda(), rows).cpu())
    assert token_ids(on_cuda) == token_ids(on_cpu)
    for a, b in zip(on_cpu, on_cuda):
        assert a.rank == b.rank
        assert (a.logprob is None) == (b.logprob is None)
        if a.logprob is not None:
            assert b.logprob == pytest.approx(a.logprob, abs=1e-5)
            assert [t for t, _ in b.top_logprobs] == [t for t, _ in a.top_logprobs]


@needs_cuda
def test_cuda_unseeded_draws_follow_softmax():
    torch.cuda.manual_seed(0)
    logits = torch.randn(8) * 1.5
    counts = draw_counts(Sampler([], 8), logits.cuda(), 20_000)
    assert chi_square(counts.cpu(), logits.double().softmax(-1)) < 24.3
