"""The reference decode's per-step plan (buckets, gathered blocks, mask) is made once and reused by every
layer of a step, and never reused for other values: a table or length refilled in place, another window,
or a sequence that grew each get a fresh plan, and every call still equals dense attention."""

import torch

from rill.kernels import reference
from test_reference_attention import dense, paged_case


def decode(q, k_cache, v_cache, tables, lens, window):
    return reference.paged_attention(q, k_cache, v_cache, tables, lens, torch.arange(lens.numel() + 1,
                                     dtype=torch.int32), 0.25, window)


def assert_dense(out, q, contexts, lens, window):
    for i, (n, (k, v)) in enumerate(zip(lens.tolist(), contexts)):
        want = dense(q[i : i + 1], k[:n], v[:n], torch.tensor([n - 1]), window, 0.25)
        torch.testing.assert_close(out[i : i + 1], want, rtol=1e-5, atol=1e-5)


def test_layers_of_a_step_share_one_plan():
    k_cache, v_cache, tables, contexts = paged_case([5, 40, 17], 4, 2, 16, None, seed=1)
    lens = torch.tensor([5, 40, 17], dtype=torch.int32)
    made = []
    real = reference._make_plan
    reference._make_plan = lambda *a: made.append(1) or real(*a)  # counting wrapper, restored below
    try:
        for layer in range(3):
            q = torch.randn(3, 4, 16)
            assert_dense(decode(q, k_cache, v_cache, tables, lens, None), q, contexts, lens, None)
        assert len(made) <= 1  # one plan for the three layers (none if an earlier test left this one)
        decode(q, k_cache, v_cache, tables, lens, 8)  # another window: its own plan
        assert len(made) <= 2 and made
    finally:
        reference._make_plan = real


def test_values_refilled_in_place_get_a_fresh_plan():
    full = [9, 33, 20]
    k_cache, v_cache, tables, contexts = paged_case(full, 4, 2, 16, None, seed=2)
    lens = torch.tensor([8, 30, 20], dtype=torch.int32)  # the first two sequences grow below
    q = torch.randn(3, 4, 16)
    assert_dense(decode(q, k_cache, v_cache, tables, lens, None), q, contexts, lens, None)
    lens.copy_(torch.tensor(full, dtype=torch.int32))  # same tensor object, new values (33: a new block)
    assert_dense(decode(q, k_cache, v_cache, tables, lens, None), q, contexts, lens, None)
    order = [2, 0, 1]  # same lengths' multiset, another table row order: the plan must not be reused
    tables.copy_(tables[order].clone())
    lens.copy_(lens[order].clone())
    assert_dense(decode(q, k_cache, v_cache, tables, lens, None), q, [contexts[i] for i in order], lens, None)
