"""The torch reference (the CPU path and the Triton kernels' oracle) against plain dense attention.

Paged caches are filled at random, every slot no query may see (past a sequence's end, inside its
last block, in blocks wholly outside the window, table entries past the sequence) holds NaN, and
sequences of very different lengths share one call, so that decode's length buckets and their
padding are exercised.
"""

import random

import pytest
import torch

from rill.kernels import reference

BLOCK = 8


def dense(q, k, v, q_pos, window, scale, softcap=None):
    """q: [Tq, H, D] at absolute positions q_pos; k/v: [Tk, Hkv, D] for positions 0..Tk-1."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:  # Gemma 2: scores / cap -> tanh -> * cap, before the mask
        scores = torch.tanh(scores / softcap) * softcap
    k_pos = torch.arange(k.shape[0])
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


def paged_case(lens, heads, kv_heads, dim, window, seed, q_lens=None):
    q_lens = q_lens or [1] * len(lens)
    rng = random.Random(seed)
    width = max(-(-n // BLOCK) for n in lens) + 2
    num_blocks = len(lens) * width + 1
    k_cache = torch.full((num_blocks, BLOCK, kv_heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables = torch.zeros(len(lens), width, dtype=torch.int32)  # block 0 stays NaN: unused entries point at it
    contexts = []
    for i, (n, q_len) in enumerate(zip(lens, q_lens)):
        k, v = torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
        contexts.append((k, v))
        # Blocks before the first query's window were freed by the engine.
        first_live = 0 if window is None else max(0, n - q_len - window + 1) // BLOCK
        for b in range(first_live, -(-n // BLOCK)):
            block = ids.pop()
            tables[i, b] = block
            part = slice(b * BLOCK, min(n, (b + 1) * BLOCK))
            k_cache[block, : part.stop - part.start] = k[part]
            v_cache[block, : part.stop - part.start] = v[part]
    return k_cache, v_cache, tables, contexts


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
def test_decode_of_mixed_lengths_equals_dense_attention(window, heads, kv_heads):
    lens = [1, 3, 8, 9, 17, 40, 41, 100, 250, 2, 64, 130]
    k_cache, v_cache, tables, contexts = paged_case(lens, heads, kv_heads, 16, window, seed=len(lens))
    q = torch.randn(len(lens), heads, 16)
    out = reference.paged_attention(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32),
                                    torch.arange(len(lens) + 1, dtype=torch.int32), 0.25, window)
    assert not out.isnan().any()
    for i, (n, (k, v)) in enumerate(zip(lens, contexts)):
        want = dense(q[i : i + 1], k, v, torch.tensor([n - 1]), window, 0.25)
        torch.testing.assert_close(out[i : i + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 12])
def test_chunked_prefill_equals_dense_attention(window):
    lens, q_lens = [30, 7, 61], [10, 7, 1]
    k_cache, v_cache, tables, contexts = paged_case(lens, 4, 2, 16, window, seed=3, q_lens=q_lens)
    q = torch.randn(sum(q_lens), 4, 16)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    out = reference.paged_attention(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), starts,
                                    0.25, window)
    for i, (n, (k, v)) in enumerate(zip(lens, contexts)):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        want = dense(q[rows], k, v, torch.arange(n - q_lens[i], n), window, 0.25)
        torch.testing.assert_close(out[rows], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
def test_a_mixed_step_equals_dense_attention(window, heads, kv_heads):
    """Decodes of many lengths (taken together through decode's buckets) interleaved with prefill
    chunks (one sequence at a time) and a sequence with no new query in the same call."""
    lens = [1, 30, 8, 9, 61, 100, 250, 2, 40, 130, 19]
    q_lens = [1, 10, 1, 1, 0, 1, 1, 2, 40, 1, 19]
    k_cache, v_cache, tables, contexts = paged_case(lens, heads, kv_heads, 16, window, seed=11, q_lens=q_lens)
    q = torch.randn(sum(q_lens), heads, 16)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    out = reference.paged_attention(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), starts,
                                    0.25, window)
    assert not out.isnan().any()
    for i, (n, (k, v)) in enumerate(zip(lens, contexts)):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        want = dense(q[rows], k, v, torch.arange(n - q_lens[i], n), window, 0.25)
        torch.testing.assert_close(out[rows], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 12])
def test_soft_capped_mixed_step_equals_dense_attention(window):
    lens, q_lens = [30, 9, 61, 40], [10, 1, 1, 40]
    k_cache, v_cache, tables, contexts = paged_case(lens, 8, 2, 16, window, seed=5, q_lens=q_lens)
    q = torch.randn(sum(q_lens), 8, 16)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    # scale 1 puts most scores past the cap of 2, where tanh bends them
    out = reference.paged_attention(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), starts,
                                    1.0, window, softcap=2.0)
    for i, (n, (k, v)) in enumerate(zip(lens, contexts)):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        want = dense(q[rows], k, v, torch.arange(n - q_lens[i], n), window, 1.0, softcap=2.0)
        torch.testing.assert_close(out[rows], want, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(want, dense(q[rows], k, v, torch.arange(n - q_lens[i], n), window, 1.0), atol=1e-3)


def test_one_thread_can_attend_inside_and_then_outside_inference_mode():
    """The gather buffers are reused per thread; one made under inference_mode (an engine step run in
    the test's own thread) must not be written outside it (it failed tests that ran after one)."""
    lens = [1, 3, 8, 9, 17, 40]
    k_cache, v_cache, tables, _ = paged_case(lens, 4, 4, 16, None, seed=1)
    q = torch.randn(len(lens), 4, 16, generator=torch.Generator().manual_seed(0))
    args = (q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32),
            torch.arange(len(lens) + 1, dtype=torch.int32), 0.25, None)
    with torch.inference_mode():
        inside = reference.paged_attention(*args).clone()
    torch.testing.assert_close(reference.paged_attention(*args), inside, rtol=0, atol=0)
