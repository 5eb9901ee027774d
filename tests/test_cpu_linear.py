"""kernels/cpu_linear.c through kernels/cpu_linear.py: y = x W^T + b against F.linear in float64, at the
edges of its tiles (6 rows, or 12 with AVX-512; 16 columns, or pairs of 16 with AVX-512; blocks of 96 rows),
and the property the engine relies on: a row's result is bitwise the same whatever the other rows, their
number, the split into calls, or the thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rill.kernels import cpu_build, cpu_linear

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="rill's C kernels are not built here")


def make(n, k, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k**0.5
    b = torch.randn(n, generator=gen) if bias else None
    return w, b


@pytest.mark.parametrize("n, k", [(1, 1), (15, 7), (16, 33), (17, 64), (33, 20), (48, 40), (50, 768), (1280, 96)])
@pytest.mark.parametrize("m", [0, 1, 2, 5, 6, 7, 8, 9, 11, 12, 13, 25, 63, 64, 65, 96, 97, 200])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_f_linear_in_float64_to_rounding(n, k, m, bias):
    w, b = make(n, k, seed=n * 1000 + k, bias=bias)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = cpu_linear.linear(x, cpu_linear.pack(w), b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k**0.5)


def test_rows_do_not_depend_on_the_batch_the_split_or_the_threads():
    w, b = make(300, 200, seed=3)
    packed = cpu_linear.pack(w)
    x = torch.randn(250, 200, generator=torch.Generator().manual_seed(4))
    whole = cpu_linear.linear(x, packed, b)
    # pieces across tile (6 or 8 rows) and block boundaries against the whole
    for size in (1, 2, 3, 5, 6, 7, 8, 9, 11, 12, 13, 25, 63, 64, 65, 95, 96, 97):
        pieces = torch.cat([cpu_linear.linear(x[i:i + size], packed, b) for i in range(0, 250, size)])
        assert torch.equal(pieces, whole), size
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_linear.linear(x, packed, b), whole)
    finally:
        torch.set_num_threads(threads)


def test_strided_rows_leading_dims_and_a_strided_weight():
    w, b = make(40, 24, seed=5)
    packed = cpu_linear.pack(w.t().contiguous().t())  # a transposed view of the same values: packed the same
    assert torch.equal(packed.data, cpu_linear.pack(w).data)
    wide = torch.randn(9, 64)
    x = wide[:, 8:32]  # rows 64 apart
    torch.testing.assert_close(cpu_linear.linear(x, packed, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    y = cpu_linear.linear(torch.randn(2, 3, 24), packed, b)
    assert y.shape == (2, 3, 40)


def test_bad_inputs_are_refused():
    packed = cpu_linear.pack(make(8, 16)[0])
    with pytest.raises(ValueError, match="15 features, the layer takes 16"):
        cpu_linear.linear(torch.randn(2, 15), packed)
    with pytest.raises(TypeError, match="float32"):
        cpu_linear.linear(torch.randn(2, 16, dtype=torch.float64), packed)


def test_packed_panels_are_aligned_and_padded_to_16_columns():
    packed = cpu_linear.pack(make(17, 5)[0])
    assert packed.data.data_ptr() % 64 == 0
    assert packed.data.numel() == 32 * 5 and (packed.out_features, packed.in_features) == (17, 5)


def test_bench_cpu_linear_writes_both_sides_the_floor_and_a_plot(tmp_path, capsys):
    import json

    from rill.bench import main

    out = tmp_path / "linear.json"
    assert main(["cpu-linear", "--layers", "o", "lm_head", "--rows", "1", "8", "128", "--repeats", "1",
                 "--copies-mb", "4", "--no-progress", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["layer"], r["rows"]) for r in rows] == [("o", 1), ("o", 8), ("o", 128), ("lm_head", 1), ("lm_head", 8)]
    assert all(r["c_ms"] > 0 and r["onednn_ms"] > 0 and r["read_floor_ms"] > 0 and r["copies"] >= 1 for r in rows)
    assert "oneDNN" in capsys.readouterr().out and out.with_suffix(".png").stat().st_size > 0
