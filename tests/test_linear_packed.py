"""models/linear.py pack_for_cpu: float32 CPU Linear layers multiply with rill's C kernel over packed
weights (oneDNN's pre-packed weights where the kernel is not built), close to F.linear, with rows that do
not depend on how many are computed together (what chunked prefill and batching rely on); layers built
with pack=False, other dtypes and shared (tied) weights keep theirs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rill.kernels import cpu_build
from rill.models.linear import Linear, pack_for_cpu


@pytest.fixture(params=["c", "onednn"])
def backend(request, monkeypatch):
    """Which packing pack_for_cpu picks: the C kernel, or oneDNN with the library unavailable."""
    if request.param == "c":
        assert cpu_build.library() is not None, cpu_build.unavailable_reason()
    else:
        if not torch.backends.mkldnn.is_available():
            pytest.skip("torch without oneDNN")
        monkeypatch.setattr(cpu_build, "_loaded", [None])
    return request.param


def packing(layer):
    return layer.c_packed if layer.c_packed is not None else layer.packed


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 32)
        self.proj = Linear(32, 48, bias=True)
        self.down = Linear(48, 32, bias=False, pack=False)
        self.head = Linear(32, 50, bias=False)
        self.head.weight = self.embed.weight
        self.wide = Linear(32, 16).to(torch.float64)


def test_pack_frees_plain_weights_except_shared_ones_and_skips_what_it_should(backend):
    model = Tied()
    assert pack_for_cpu(model) == 2  # proj and head
    assert (model.proj.c_packed is not None) == (backend == "c") and (model.proj.packed is not None) == (
        backend == "onednn")
    assert packing(model.proj) is not None and model.proj.weight.numel() == 0  # freed
    assert packing(model.head) is not None and model.embed.weight.shape == (50, 32)  # the tie keeps it
    assert packing(model.down) is None and model.down.weight.shape == (32, 48)  # pack=False
    assert packing(model.wide) is None  # float64
    assert pack_for_cpu(model) == 0  # idempotent
    assert pack_for_cpu(object()) == 0  # not a module (a tensor-parallel driver's handle)


def test_packed_layers_equal_f_linear_to_rounding_and_rows_do_not_depend_on_the_batch(backend):
    model = Tied()
    plain_w, plain_b, head_w = model.proj.weight.detach().clone(), model.proj.bias.detach().clone(), model.embed.weight
    pack_for_cpu(model)
    x = torch.randn(300, 32)
    with torch.inference_mode():
        full = model.proj(x)
        torch.testing.assert_close(full, F.linear(x, plain_w, plain_b), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.head(x[:8]), F.linear(x[:8], head_w), rtol=1e-5, atol=1e-5)
        for rows in (1, 2, 3, 8, 9, 17):
            assert torch.equal(model.proj(x[:rows]), full[:rows]), rows
        assert model.proj(x.view(10, 30, 32)).shape == (10, 30, 48)  # leading dims kept
