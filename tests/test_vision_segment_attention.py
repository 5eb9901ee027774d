"""The vision towers' attention within segments (frames, windows): runs of equal-length segments go as one
batched call; each segment still sees only itself, as one SDPA call per segment computes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rill.models.qwen2_vl_vision import segment_attention


def per_segment(q, k, v, cu_seqlens):
    out = torch.empty_like(q)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if end > start:
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
    return out


def test_runs_of_equal_segments_match_one_call_per_segment():
    torch.manual_seed(0)
    lengths = [16, 16, 16, 4, 0, 9, 9, 16, 1]  # runs of equal lengths, a lone one, an empty one, one token
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    q, k, v = (torch.randn(cu[-1], 4, 32) for _ in range(3))
    got = segment_attention(q, k, v, cu)
    torch.testing.assert_close(got, per_segment(q, k, v, cu), atol=1e-6, rtol=1e-5)


def test_a_segment_does_not_see_its_neighbour():
    torch.manual_seed(1)
    cu = [0, 8, 16]
    q, k, v = (torch.randn(16, 2, 8) for _ in range(3))
    before = segment_attention(q, k, v, cu)
    k2, v2 = k.clone(), v.clone()
    k2[8:], v2[8:] = torch.randn(8, 2, 8), torch.randn(8, 2, 8)  # change only the second segment's keys and values
    after = segment_attention(q, k2, v2, cu)
    assert torch.equal(before[:8], after[:8]) and not torch.allclose(before[8:], after[8:])
