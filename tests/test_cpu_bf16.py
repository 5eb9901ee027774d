"""rill's bfloat16 CPU kernels (kernels/cpu_linear_bf16.c, cpu_attn_bf16.c, cpu_glue_bf16.c) against torch:
the linear layer within bfloat16's rounding of the float64 product, decode attention within bfloat16's
tolerance of the reference in float32 over the same values, the glue against models/llama.py's torch code in
bfloat16; and the properties the engine relies on: a row's (a sequence's) result bitwise the same whatever
the batch, the split into calls or the thread count; the plain C, AVX2 and AVX-512 builds compile and the
ones this CPU runs agree bit for bit on the linear layer (one order of arithmetic on every path)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rill.kernels import cpu_attn, cpu_build, cpu_glue, cpu_linear, reference
from rill.models.rope import apply_rotary

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="rill's C kernels are not built here")
BF16 = torch.bfloat16


def make(n, k, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(BF16)
    b = torch.randn(n, generator=gen).to(BF16) if bias else None
    return w, b


def exact(x, w, b):
    """The product in float64 from the same bfloat16 values."""
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def threads(n):
    class Threads:
        def __enter__(self):
            self.before = torch.get_num_threads()
            torch.set_num_threads(n)

        def __exit__(self, *exc):
            torch.set_num_threads(self.before)
    return Threads()


@pytest.mark.parametrize("n, k", [(1, 1), (15, 7), (16, 33), (17, 64), (33, 20), (48, 40), (50, 768), (1280, 96)])
@pytest.mark.parametrize("m", [0, 1, 5, 6, 7, 8, 9, 12, 13, 64, 97])
def test_linear_is_the_exact_product_rounded_once_to_bfloat16(n, k, m):
    w, b = make(n, k, seed=n * 1000 + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(BF16)
    got = cpu_linear.linear(x, cpu_linear.pack(w), b)
    want = exact(x, w, b)
    assert got.shape == (m, n) and got.dtype == BF16
    # float32 sums then one rounding: within a bfloat16 step (2^-8 relative) of the exact value
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-5 * k**0.5)
    torch.testing.assert_close(got, F.linear(x, w, b))  # torch's bfloat16 linear, at its own tolerance


def test_linear_into_a_float32_out_skips_the_rounding():
    w, b = make(70, 300, seed=1)
    x = torch.randn(9, 300).to(BF16)
    out = torch.empty(9, 70)
    got = cpu_linear.linear(x, cpu_linear.pack(w), b, out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact(x, w, b), rtol=1e-5, atol=1e-5)
    assert torch.equal(got.to(BF16), cpu_linear.linear(x, cpu_linear.pack(w), b))


def test_linear_rows_do_not_depend_on_the_batch_the_split_or_the_threads():
    w, b = make(300, 200, seed=3)
    packed = cpu_linear.pack(w)
    x = torch.randn(250, 200, generator=torch.Generator().manual_seed(4)).to(BF16)
    whole = cpu_linear.linear(x, packed, b)
    for size in (1, 6, 7, 8, 9, 13, 97):
        pieces = torch.cat([cpu_linear.linear(x[i:i + size], packed, b) for i in range(0, 250, size)])
        assert torch.equal(pieces, whole), size
    with threads(1):
        assert torch.equal(cpu_linear.linear(x, packed, b), whole)


def test_packed_bf16_panels_are_aligned_paired_and_padded():
    w, _ = make(17, 5)
    packed = cpu_linear.pack(w)
    assert packed.dtype == BF16 and packed.data.dtype == torch.int32 and packed.data.data_ptr() % 64 == 0
    assert packed.data.numel() == 32 * 3  # 2 panels of 16 columns x 3 pairs of features (5 padded to 6)
    with pytest.raises(TypeError, match="bfloat16"):
        cpu_linear.linear(torch.randn(2, 5), packed)  # float32 rows for bfloat16 weights


# -- the builds: plain C, AVX2, AVX-512 (BF16): compile everywhere, run where the CPU has the instructions

def linear_with(lib, x, w, b):
    with cpu_build.using(lib):
        return cpu_linear.linear(x, cpu_linear.pack(w), b)


def test_plain_c_and_avx2_builds_compute_the_same_bits_as_this_build():
    w, b = make(100, 515, seed=5)
    x = torch.randn(21, 515).to(BF16)
    here = cpu_linear.linear(x, cpu_linear.pack(w), b)
    for isa in ("generic", "avx2"):
        if not cpu_build.cpu_has(isa):
            continue
        lib = cpu_build.load(isa)
        assert lib.rill_bf16_path().decode() == {"generic": "generic", "avx2": "avx2"}[isa]
        assert torch.equal(linear_with(lib, x, w, b), here), isa


@pytest.mark.slow  # two more compilations of the library (about a minute on 2 busy cores)
def test_avx512_builds_compile_and_where_the_cpu_runs_them_agree():
    w, b = make(100, 515, seed=6)
    x = torch.randn(21, 515).to(BF16)
    here = cpu_linear.linear(x, cpu_linear.pack(w), b)
    for isa, path in (("avx512_bf16", "avx512_bf16"), ("avx512", "avx2")):
        lib = cpu_build.load(isa)  # compiles on any x86-64 machine
        if cpu_build.cpu_has(isa):
            assert lib.rill_bf16_path().decode() == path
            got = linear_with(lib, x, w, b)
            torch.testing.assert_close(got.double(), exact(x, w, b), rtol=2**-8, atol=1e-4)
            # one order of arithmetic: the same bits unless a denormal was flushed (none in these values)
            assert torch.equal(got, here), isa


# -- decode attention over a bfloat16 cache

def make_cache(gen, lens, heads=12, kv_heads=4, dim=64, block_size=16):
    blocks = [-(-n // block_size) for n in lens]
    num = sum(blocks) + 2
    k = torch.randn(num, block_size, kv_heads, dim, generator=gen).to(BF16)
    v = torch.randn(num, block_size, kv_heads, dim, generator=gen).to(BF16)
    order = torch.randperm(num, generator=gen).to(torch.int32)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used:used + n]
        used += n
    q = torch.randn(len(lens), heads, dim, generator=gen).to(BF16)
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    return q, k, v, tables, torch.tensor(lens, dtype=torch.int32), starts


@pytest.mark.parametrize("window, softcap", [(None, None), (40, None), (None, 20.0)])
@pytest.mark.parametrize("heads, kv_heads, dim, block_size", [(12, 4, 64, 16), (8, 8, 128, 16), (6, 3, 80, 16),
                                                              (4, 2, 12, 8), (16, 2, 256, 16), (10, 2, 32, 4)])
def test_decode_attention_is_the_float32_reference_rounded(heads, kv_heads, dim, block_size, window, softcap):
    gen = torch.Generator().manual_seed(heads * 100 + dim)
    q, k, v, *rest = make_cache(gen, [1, 7, 8, 9, 17, 100, 333], heads, kv_heads, dim, block_size)
    got = cpu_attn.paged_attention(q, k, v, *rest, dim**-0.5, window, softcap=softcap)
    want = reference.paged_attention(q.float(), k.float(), v.float(), *rest, dim**-0.5, window, softcap=softcap)
    assert got.dtype == BF16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-5)  # float32 sums, one rounding
    torch.testing.assert_close(got, reference.paged_attention(q, k, v, *rest, dim**-0.5, window, softcap=softcap))


def test_decode_attention_rows_do_not_depend_on_the_batch_or_the_threads():
    gen = torch.Generator().manual_seed(9)
    q, k, v, tables, lens, _ = make_cache(gen, [5, 40, 77, 300, 16, 1, 129, 64])
    batched = cpu_attn.decode(q, k, v, tables, lens, 0.125, None, None)
    for i in range(len(lens)):  # alone: one sequence, a task per KV head group instead of per sequence
        alone = cpu_attn.decode(q[i:i + 1], k, v, tables[i:i + 1], lens[i:i + 1], 0.125, None, None)
        assert torch.equal(alone[0], batched[i]), i
    with threads(1):
        assert torch.equal(cpu_attn.decode(q, k, v, tables, lens, 0.125, None, None), batched)


# -- the glue, against models/llama.py's torch code in bfloat16

def torch_rms_norm(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(BF16)


def test_rms_norm_with_the_residual_add_matches_torch_in_bfloat16():
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(37, 200, generator=gen) * 3).to(BF16)
    d = torch.randn(37, 200, generator=gen).to(BF16)
    w = (torch.rand(200, generator=gen) + 0.5).to(BF16)
    want_sum = x + d
    want = torch_rms_norm(want_sum, w, 1e-6)
    got = cpu_glue.rms_norm(x, w, 1e-6, delta=d)
    assert torch.equal(x, want_sum)  # the residual stream, updated in place and rounded as torch rounds it
    torch.testing.assert_close(got, want)
    assert (got == want).float().mean().item() > 0.99  # the sum of squares' order may move a last bit


def test_rotary_and_kv_write_are_torch_bits_in_bfloat16():
    gen = torch.Generator().manual_seed(3)
    rows, heads, kv_heads, dim = 9, 6, 2, 32
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16)
    angles = torch.rand(rows, 1, dim // 2, generator=gen) * 6
    cos = torch.cat([angles.cos()] * 2, -1).to(BF16)
    sin = torch.cat([angles.sin()] * 2, -1).to(BF16)
    q, k, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    want_q = apply_rotary(q.reshape(rows, heads, dim), cos, sin)
    want_k = apply_rotary(k.reshape(rows, kv_heads, dim), cos, sin)
    k_cache = torch.zeros(4, 4, kv_heads, dim, dtype=BF16)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([3, 0, 1, 2, 5, 4, -1, 7, 6])
    got_q = cpu_glue.rotary_write_kv(qkv, cos, sin, heads, kv_heads, k_cache, v_cache, slots)
    assert torch.equal(got_q, want_q)
    flat_k, flat_v = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
    written = slots >= 0
    assert torch.equal(flat_k[slots[written]], want_k[written])
    assert torch.equal(flat_v[slots[written]], v.reshape(rows, kv_heads, dim)[written])


def test_silu_mul_matches_torch_in_bfloat16():
    gen = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(5, 2 * 131, generator=gen) * 4).to(BF16)
    gate, up = gate_up.split(131, -1)
    want = F.silu(gate) * up
    got = cpu_glue.silu_mul(gate_up)
    assert got.dtype == BF16
    torch.testing.assert_close(got, want)
    assert (got == want).float().mean().item() > 0.99
