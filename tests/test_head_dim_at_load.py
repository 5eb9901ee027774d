"""A head size rill's Triton attention kernels cannot run is refused when the model loads (building its
ModelRunner), not at its first attention call. Triton's interpreter (TRITON_INTERPRET=1) sends CPU tensors to
the Triton kernels as CUDA does, so the check runs here without a GPU."""

from __future__ import annotations

import pytest
import torch

from helpers_models import make_model_dir
from rill.engine.model_runner import ModelRunner
from rill.engine.sampler import Sampler
from rill.kernels import check_head_dim
from rill.models.loader import load

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def heads_of_12(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("hd12") / "m", "llama", hidden_size=48, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=12)


def test_triton_refuses_heads_of_12_when_the_runner_is_built(heads_of_12, monkeypatch):
    _, cfg, _, model = load(heads_of_12, dtype="float32")
    assert cfg.head_dim == 12
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=r"head_dim 12 is not a power of two >= 16.*--device cpu"):
        ModelRunner(model, 8, 16, Sampler((), cfg.vocab_size))


def test_the_cpu_kernels_take_heads_of_12(heads_of_12, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, cfg, _, model = load(heads_of_12, dtype="float32")
    ModelRunner(model, 8, 16, Sampler((), cfg.vocab_size))  # no refusal: the CPU path runs any head size


@pytest.mark.parametrize("head_dim, ok", [(8, False), (16, True), (24, False), (32, True), (128, True)])
def test_the_limit_is_powers_of_two_from_16(head_dim, ok, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if ok:
        check_head_dim(head_dim, torch.device("cpu"))
    else:
        with pytest.raises(ValueError, match=f"head_dim {head_dim}"):
            check_head_dim(head_dim, torch.device("cpu"))
