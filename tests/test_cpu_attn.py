"""rill's C decode attention for CPUs (kernels/cpu_attn.c) against the torch reference, its oracle.

The library is compiled on first use with the machine's C compiler; without one, or with
RILL_CPU_KERNELS=0, CPU attention falls back to the reference (tested by fault injection below).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from rill.kernels import cpu_attn, cpu_build, dispatch, reference

HAVE_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang")) or bool(os.environ.get("CC"))


def make_case(gen, lens, heads=12, kv_heads=4, dim=64, block_size=16, q_lens=None):
    """A shuffled paged cache holding each sequence's context; queries for q_lens (default 1 each)."""
    q_lens = q_lens or [1] * len(lens)
    blocks = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(blocks) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used:used + n]
        used += n
    query = torch.randn(sum(q_lens), heads, dim, generator=gen)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return query, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), starts


def both(case, scale=0.125, window=None, softcap=None):
    expected = reference.paged_attention(*case, scale, window, softcap=softcap)
    got = cpu_attn.paged_attention(*case, scale, window, softcap=softcap)
    return expected, got


@pytest.fixture(autouse=True)
def _library():
    if HAVE_CC:
        assert cpu_build.library() is not None, cpu_build.unavailable_reason()
    else:
        pytest.skip("no C compiler on this machine: CPU attention runs the torch reference")


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("softcap", [None, 20.0])
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [
    (12, 4, 64, 16),  # random-qwen2-100m's shape
    (8, 8, 128, 16),  # no grouping
    (16, 2, 256, 32),  # wide heads, large groups
    (6, 3, 80, 16),  # a head_dim that is not a multiple of 64: the remainder lanes
    (4, 2, 12, 8),  # nor of 8: the plain loops throughout
])
def test_decode_matches_the_reference(heads, kv_heads, dim, block_size, window, softcap):
    gen = torch.Generator().manual_seed(heads * 1000 + dim)
    # lengths around the 8-position blocks and the pages: 1, 7, 8, 9, a page, a page + 1, long ones
    lens = [1, 7, 8, 9, block_size, block_size + 1, 100, 333]
    case = make_case(gen, lens, heads, kv_heads, dim, block_size)
    expected, got = both(case, scale=dim ** -0.5, window=window, softcap=softcap)
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_mixed_step_decode_rows_in_c_and_prefill_chunks_in_torch():
    gen = torch.Generator().manual_seed(3)
    case = make_case(gen, lens=[40, 1, 90, 17], q_lens=[1, 1, 30, 1])
    expected, got = both(case, window=24)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 300, 40])
def test_whole_sequence_prefill_chunks_give_the_bits_of_the_explicit_causal_mask(window):
    # A chunk that is its whole sequence takes torch's is_causal (key blocks past the queries skipped);
    # a window shorter than the sequence keeps the explicit mask. Either way: each sequence's SDPA over
    # its own context with the causal (+ window) mask written out, bit for bit.
    import torch.nn.functional as F

    lens = [1, 17, 64, 200, 257]
    case = make_case(torch.Generator().manual_seed(11), lens, q_lens=lens)
    query, k_cache, v_cache, tables, seq_lens, starts = case
    got = reference.paged_attention(*case, 0.125, window)
    for i, n in enumerate(lens):
        k = reference._gather_context(k_cache, tables[i], 0, (n + 15) // 16)[:n]
        v = reference._gather_context(v_cache, tables[i], 0, (n + 15) // 16)[:n]
        pos = torch.arange(n)
        mask = pos[None, :] <= pos[:, None]
        if window is not None:
            mask &= pos[None, :] > pos[:, None] - window
        q = query[starts[i] : starts[i + 1]]
        want = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                              v.transpose(0, 1)[None], attn_mask=mask, scale=0.125,
                                              enable_gqa=True)[0].transpose(0, 1)
        assert torch.equal(got[starts[i] : starts[i + 1]], want), (n, window)


def test_a_sequence_gets_the_same_bits_alone_batched_and_on_any_thread_count():
    gen = torch.Generator().manual_seed(5)
    query, k_cache, v_cache, tables, lens, starts = make_case(gen, [1, 50, 200, 333, 64, 9])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        batched_one_thread = cpu_attn.paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125)
        torch.set_num_threads(2)
        batched = cpu_attn.paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125)
        for i in range(len(lens)):
            alone = cpu_attn.paged_attention(query[i:i + 1], k_cache, v_cache, tables[i:i + 1], lens[i:i + 1],
                                             starts[:2], 0.125)
            assert torch.equal(alone[0], batched[i]), i
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batched, batched_one_thread)


def test_dispatch_sends_float32_and_bfloat16_cpu_decode_to_c_and_the_rest_to_the_reference(monkeypatch):
    calls = []
    real = cpu_build.library()
    lib = type("Spy", (), {
        "rill_paged_decode_f32": lambda self, *a: calls.append("f32") or real.rill_paged_decode_f32(*a),
        "rill_paged_decode_bf16": lambda self, *a: calls.append("bf16") or real.rill_paged_decode_bf16(*a),
    })()
    monkeypatch.setattr(cpu_build, "library", lambda: lib)
    gen = torch.Generator().manual_seed(7)
    case = make_case(gen, [20, 30])
    dispatch.paged_attention(*case, 0.125)
    assert calls == ["f32"]
    query, k_cache, v_cache, *rest = case
    dispatch.paged_attention(query.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), *rest, 0.125)
    assert calls == ["f32", "bf16"]  # kernels/cpu_attn_bf16.c
    dispatch.paged_attention(query.half(), k_cache.half(), v_cache.half(), *rest, 0.125)  # reference
    big = make_case(gen, [5], heads=2, kv_heads=1, dim=cpu_attn.MAX_HEAD_DIM + 8)  # past the C buffers
    torch.testing.assert_close(dispatch.paged_attention(*big, 0.1), reference.paged_attention(*big, 0.1))
    assert calls == ["f32", "bf16"]


def test_output_rows_written_into_a_strided_out_buffer():
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, [30, 70, 5])
    out = torch.full((3, 12, 128), float("nan"))[:, :, :64]  # not contiguous: the C result is copied in
    cpu_attn.paged_attention(*case, 0.125, out=out)
    torch.testing.assert_close(out, reference.paged_attention(*case, 0.125), atol=2e-5, rtol=1e-5)


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """cpu_build with nothing loaded yet and its cache in tmp_path (restored afterwards)."""
    monkeypatch.setattr(cpu_build, "_loaded", [])
    monkeypatch.setattr(cpu_build, "_why", [])
    monkeypatch.setenv("RILL_CACHE", str(tmp_path))
    return tmp_path / "kernels"


def test_built_once_per_machine_then_loaded_from_the_cache(fresh_build, monkeypatch):
    assert cpu_build.library() is not None and cpu_build.unavailable_reason() is None
    (built,) = fresh_build.glob("rill_cpu-*.so")
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(cpu_build, "_loaded", [])
    compiles = []
    real_run = cpu_build.subprocess.run
    monkeypatch.setattr(cpu_build.subprocess, "run", lambda cmd, **kw: compiles.append(cmd) or real_run(cmd, **kw))
    assert cpu_build.library() is not None
    assert [c for c in compiles if "-o" in c] == [] and built.stat().st_mtime_ns == stamp


def test_fault_injected_no_compiler_falls_back_to_the_reference(fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-cc"))
    gen = torch.Generator().manual_seed(13)
    case = make_case(gen, [12, 40])
    with caplog.at_level("WARNING", logger="rill.kernels"):
        out = dispatch.paged_attention(*case, 0.125)
    assert cpu_build.library() is None and "no-such-cc" in cpu_build.unavailable_reason()
    assert "torch reference" in caplog.text
    assert torch.equal(out, reference.paged_attention(*case, 0.125))


def test_fault_injected_compile_error_falls_back(fresh_build, monkeypatch):
    broken = fresh_build.parent / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(cpu_build, "SOURCES", (broken,))
    assert cpu_build.library() is None
    assert "failed" in cpu_build.unavailable_reason()
    assert not list(fresh_build.glob("*.so")) and not list(fresh_build.glob("tmp*"))  # no half-written library


def test_rill_cpu_kernels_0_turns_it_off(fresh_build, monkeypatch):
    monkeypatch.setenv("RILL_CPU_KERNELS", "0")
    assert cpu_build.library() is None and cpu_build.unavailable_reason() == "RILL_CPU_KERNELS=0"
    assert not fresh_build.exists()


def test_bench_cpu_attention_writes_both_sides_the_floor_and_a_plot(tmp_path, capsys):
    import json

    from rill.bench import main

    out = tmp_path / "attn.json"
    assert main(["cpu-attention", "--batches", "1", "4", "--contexts", "40", "--repeats", "2", "--no-progress",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 40), (4, 40)]
    assert all(r["c_ms"] > 0 and r["reference_ms"] > 0 and r["read_floor_ms"] > 0 for r in rows)
    assert rows[1]["kv_bytes"] == 2 * 4 * 40 * 4 * 64 * 4
    assert "reference" in capsys.readouterr().out and out.with_suffix(".png").stat().st_size > 0
