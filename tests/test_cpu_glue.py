"""kernels/cpu_glue.c through kernels/cpu_glue.py: RMSNorm (with the residual add), the rotary embedding
with the KV write, and SiLU-times-up against the torch code they replace in models/llama.py, at sizes
across the AVX2 loops' edges and across the single-thread / OpenMP threshold; a row's result bitwise the
same whatever the other rows or the thread count; and a whole model the same with and without them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers_models import make_model_dir
from rill.kernels import cpu_build, cpu_glue, reference
from rill.models.rope import apply_rotary

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="rill's C kernels are not built here")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def torch_rms_norm(x, w, eps):
    x = x.double()
    return (w.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))).float()


@pytest.mark.parametrize("rows", [0, 1, 3, 64, 2048])
@pytest.mark.parametrize("dim", [1, 7, 8, 16, 24, 64, 768, 4099])
def test_rms_norm_equals_torch_in_float64_to_rounding(rows, dim):
    x = torch.randn(rows, dim, generator=gen(dim)) * 3
    w = torch.randn(dim, generator=gen(dim + 1))
    torch.testing.assert_close(cpu_glue.rms_norm(x, w, 1e-6), torch_rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_rms_norm_with_a_delta_adds_it_in_place_exactly_then_normalizes_the_sum():
    x = torch.randn(70, 768, generator=gen(1))
    delta = torch.randn(70, 768, generator=gen(2))
    w = torch.randn(768, generator=gen(3))
    want_x = x + delta
    out = cpu_glue.rms_norm(x, w, 1e-5, delta=delta)
    assert torch.equal(x, want_x)  # one float add per element, as torch's
    torch.testing.assert_close(out, torch_rms_norm(want_x, w, 1e-5), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_glue.rms_norm(torch.randn(768, 70).t(), w, 1e-5, delta=delta)


def test_rms_norm_of_a_strided_view_and_extra_dims():
    x = torch.randn(5, 12, 64, generator=gen(4))[:, ::2]  # q_norm's per-head rows, not contiguous
    w = torch.randn(64, generator=gen(5))
    torch.testing.assert_close(cpu_glue.rms_norm(x, w, 1e-6), torch_rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def rope_tables(positions, dim, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    freqs = positions.float()[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


@pytest.mark.parametrize("rows, heads, kv_heads, dim", [(1, 1, 1, 2), (7, 4, 2, 12), (29, 12, 4, 64), (600, 8, 8, 128)])
def test_rotary_kv_rotates_q_and_k_exactly_as_torch_and_writes_k_and_v_to_their_slots(rows, heads, kv_heads, dim):
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen(rows))
    cos, sin = rope_tables(torch.arange(1000, 1000 + rows), dim)
    num_blocks, block_size = -(-rows * 2 // 16) + 1, 16
    k_cache = torch.full((num_blocks, block_size, kv_heads, dim), 7.0)
    v_cache = torch.full_like(k_cache, 7.0)
    slots = torch.randperm(num_blocks * block_size, generator=gen(9))[:rows]
    slots[::3] = -1  # a negative slot is not written (the padding rows of a captured step)
    q, k, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    want_q = apply_rotary(q.view(rows, heads, dim), cos, sin)
    want_k = apply_rotary(k.reshape(rows, kv_heads, dim), cos, sin)
    want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
    reference.write_kv(want_k, v.reshape(rows, kv_heads, dim), want_k_cache, want_v_cache, slots)

    got_q = cpu_glue.rotary_write_kv(qkv, cos, sin, heads, kv_heads, k_cache, v_cache, slots)
    assert got_q.shape == (rows, heads, dim) and got_q.data_ptr() == qkv.data_ptr()  # a view: rotated in place
    assert torch.equal(got_q, want_q)  # two rounded products and their rounded sum: torch's bits
    assert torch.equal(k_cache, want_k_cache) and torch.equal(v_cache, want_v_cache)


def test_silu_mul_equals_torch_to_rounding_and_stays_finite_at_the_extremes():
    for rows, inter in [(0, 8), (1, 1), (3, 7), (64, 2048), (513, 100)]:
        gate_up = torch.randn(rows, 2 * inter, generator=gen(inter)) * 4
        gate, up = gate_up.double().split(inter, -1)
        got = cpu_glue.silu_mul(gate_up)
        assert got.shape == (rows, inter)
        torch.testing.assert_close(got, (F.silu(gate) * up).float(), rtol=2e-6, atol=1e-6)
    big = torch.tensor([-1e4, -200.0, -88.0, -30.0, 0.0, 30.0, 88.0, 200.0, 1e4] * 2)
    got = cpu_glue.silu_mul(torch.cat([big, torch.ones(18)])[None])[0]
    torch.testing.assert_close(got, F.silu(big), rtol=1e-6, atol=1e-30)


def test_rows_do_not_depend_on_the_batch_or_the_threads():
    x = torch.randn(300, 768, generator=gen(11))
    w = torch.randn(768, generator=gen(12))
    gate_up = torch.randn(300, 512, generator=gen(13))
    qkv = torch.randn(300, 20 * 64, generator=gen(14))
    cos, sin = rope_tables(torch.arange(300), 64)
    cache = torch.zeros(40, 16, 4, 64)

    def rotary(rows):
        return cpu_glue.rotary_write_kv(qkv[rows].clone(), cos[rows], sin[rows], 12, 4, cache, cache.clone(),
                                        torch.full((rows.stop - rows.start,), -1)).clone()

    def all_three(rows):
        return cpu_glue.rms_norm(x[rows], w, 1e-6), cpu_glue.silu_mul(gate_up[rows]), rotary(rows)

    whole = all_three(slice(0, 300))  # above the threshold where the rows are split among threads
    for size in (1, 7, 64):
        pieces = [all_three(slice(i, min(i + size, 300))) for i in range(0, 300, size)]
        for part, want in zip(zip(*pieces), whole):
            assert torch.equal(torch.cat(part), want), size
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for got, want in zip(all_three(slice(0, 300)), whole):
            assert torch.equal(got, want)
    finally:
        torch.set_num_threads(threads)


def test_supports_only_float32_or_bfloat16_cpu_tensors_of_one_dtype():
    assert cpu_glue.supports(torch.zeros(2), torch.zeros(3))
    assert cpu_glue.supports(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16))
    assert not cpu_glue.supports(torch.zeros(2), torch.zeros(3, dtype=torch.bfloat16))
    assert not cpu_glue.supports(torch.zeros(2, dtype=torch.float16))


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_a_model_computes_the_same_with_and_without_the_c_glue(tmp_path, monkeypatch, family):
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from rill.sampling_params import SamplingParams

    model = make_model_dir(tmp_path, family)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
    prompts = [[(7 * i + j) % 300 + 3 for j in range(5 + 9 * i)] for i in range(4)]

    def run():
        core = EngineCore(EngineConfig(model=str(model), num_kv_blocks=64, max_num_batched_tokens=32))
        for i, ids in enumerate(prompts):
            core.add_request(f"r{i}", ids, params)
        out = {}
        while core.has_work:
            for d in core.step():
                out.setdefault(d.request_id, []).extend(
                    (t, lp.logprob) for t, lp in zip(d.token_ids, d.logprobs or [None] * len(d.token_ids))
                    if lp is not None)
        return out

    with_glue = run()
    monkeypatch.setattr(cpu_glue, "supports", lambda *tensors: False)
    without = run()
    assert with_glue.keys() == without.keys()
    for rid in with_glue:
        assert [t for t, _ in with_glue[rid]] == [t for t, _ in without[rid]]
        torch.testing.assert_close(torch.tensor([lp for _, lp in with_glue[rid]]),
                                   torch.tensor([lp for _, lp in without[rid]]), rtol=1e-4, atol=1e-4)


def test_scratch_is_one_buffer_per_name_and_thread_that_grows_as_needed():
    import threading

    a = cpu_glue.scratch("test-a", 4, 8)
    assert a.shape == (4, 8) and a.dtype == torch.float32
    assert cpu_glue.scratch("test-a", 2, 8).data_ptr() == a.data_ptr()  # smaller: the same memory
    assert cpu_glue.scratch("test-b", 4, 8).data_ptr() != a.data_ptr()
    bigger = cpu_glue.scratch("test-a", 64, 64)
    assert bigger.shape == (64, 64) and cpu_glue.scratch("test-a", 4, 8).data_ptr() == bigger.data_ptr()
    with torch.inference_mode():
        assert cpu_glue.scratch("test-a", 4, 8).data_ptr() != bigger.data_ptr()
    other = []
    thread = threading.Thread(target=lambda: other.append(cpu_glue.scratch("test-a", 4, 8).data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != bigger.data_ptr()


def test_linear_writes_into_out_and_refuses_a_wrong_one():
    from rill.kernels import cpu_linear

    w = torch.randn(40, 24, generator=gen(20))
    x = torch.randn(7, 24, generator=gen(21))
    packed = cpu_linear.pack(w)
    out = torch.empty(7 * 40)
    y = cpu_linear.linear(x, packed, None, out.view(7, 40))
    assert y.data_ptr() == out.data_ptr() and torch.equal(y, cpu_linear.linear(x, packed))
    for bad in (torch.empty(7, 39), torch.empty(40, 7).t(), torch.empty(7, 40, dtype=torch.float64)):
        with pytest.raises(ValueError, match="out must be"):
            cpu_linear.linear(x, packed, None, bad)


def test_a_model_computes_the_same_bits_with_scratch_buffers_as_with_fresh_ones(tmp_path, monkeypatch):
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from rill.sampling_params import SamplingParams

    model = make_model_dir(tmp_path, "qwen2")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)

    def run():
        core = EngineCore(EngineConfig(model=str(model), num_kv_blocks=64, max_num_batched_tokens=40))
        for i in range(3):
            core.add_request(f"r{i}", [(5 * i + j) % 300 + 3 for j in range(30 + 7 * i)], params)
        out = []
        while core.has_work:
            out += [(d.request_id, d.token_ids, [lp.logprob for lp in d.logprobs or []]) for d in core.step()]
        return out

    reused = run()
    monkeypatch.setattr(cpu_glue, "scratch",
                        lambda name, rows, cols, dtype=torch.float32: torch.empty(rows, cols, dtype=dtype))
    assert reused == run()
