"""Mixture-of-experts decoders: Mixtral (MixtralForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM).

The attention is the Llama family's (Qwen3-MoE with q/k norm); the MLP of a sparse layer is a router
and num_experts gated MLPs. Each token runs its top_k experts and sums their outputs weighted by the
router's probabilities. Tokens are routed in batched form: the (token, expert) pairs of the step are
sorted by expert, each active expert runs one fused gate_up GEMM and one down GEMM over all its
tokens, and the weighted rows are scatter-added back to their tokens. The loop is over experts,
never over tokens; the GEMM sizes cost one device-to-host copy per layer (a grouped-GEMM kernel, as
vLLM's fused_moe, would avoid it; rill has none).

Numerics follow transformers: router softmax in float32; Mixtral renormalizes the top-k and weights
the expert outputs in float32, Qwen3-MoE renormalizes only with norm_topk_prob and rounds the
weights to the model dtype first; contributions are added per token in ascending expert order.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from rill.models.config import ModelConfig, MoeConfig
from rill.models.llama import CausalLM

# Checkpoint names: the sparse block's prefix in a layer, and each expert's gate, up and down tensors.
_CHECKPOINT_NAMES = {
    "MixtralForCausalLM": ("block_sparse_moe", "w1", "w3", "w2"),
    "Qwen3MoeForCausalLM": ("mlp", "gate_proj", "up_proj", "down_proj"),
}
_EXPERT_PARAM = re.compile(r"layers\.(\d+)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)")


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, E] logits -> (weights [T, top_k] float32, expert ids [T, top_k] int64)."""
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def grouped_experts(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor) -> torch.Tensor:
    """Run each token through its experts, grouped by expert.

    x [T, H]; experts, weights [T, k]; gate_up [E, 2I, H] (gate rows first); down [E, H, I] -> [T, H].
    """
    k = experts.shape[1]
    order = experts.flatten().argsort(stable=True)  # (token, slot) pairs grouped by expert, ascending
    tokens = order // k
    counts = torch.bincount(experts.flatten(), minlength=gate_up.shape[0]).tolist()
    rows = x[tokens]  # [T * k, H]
    out = torch.empty_like(rows)
    start = 0
    for expert, n in enumerate(counts):
        if n:
            out[start:start + n] = _expert_mlp(rows[start:start + n], gate_up[expert], down[expert])
            start += n
    weighted = (out * weights.flatten()[order, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, tokens, weighted)


def _expert_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


class Experts(nn.Module):
    """The experts' weights stacked, one fused gate_up and one down matrix per expert."""

    def __init__(self, moe: MoeConfig, hidden_size: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(moe.num_experts, 2 * moe.intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(moe.num_experts, hidden_size, moe.intermediate_size))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return grouped_experts(x, experts, weights, self.gate_up_proj, self.down_proj)


class SparseMoeBlock(nn.Module):
    """Router (`gate`, no bias) + experts: the MLP of a sparse layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.moe = cfg.moe
        self.gate = nn.Linear(cfg.hidden_size, cfg.moe.num_experts, bias=False)
        self.experts = Experts(cfg.moe, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.moe.top_k, self.moe.norm_topk_prob)
        if self.moe.weights_in_model_dtype:
            weights = weights.to(x.dtype)
        return self.experts(x, experts, weights)


class MoeCausalLM(CausalLM):
    """Llama's decoder with a SparseMoeBlock as the MLP of every sparse layer (Qwen3-MoE may keep
    dense MLPs in some layers: mlp_only_layers, decoder_sparse_step)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        # The dense MLPs replaced here cost nothing: the loader builds the model on the meta device.
        for layer, sparse in zip(self.layers, cfg.moe.sparse_layers):
            if sparse:
                layer.mlp = SparseMoeBlock(cfg)


def expert_checkpoint_names(name: str, cfg: ModelConfig) -> list[str] | None:
    """The checkpoint tensors whose rows, concatenated in order, fill rill's expert parameter `name`
    (stacked [E, rows, cols] parameters are filled as [E * rows, cols]); None for other parameters."""
    match = _EXPERT_PARAM.fullmatch(name)
    if match is None or cfg.moe is None:
        return None
    block, gate, up, down = _CHECKPOINT_NAMES[cfg.architecture]
    prefix = f"model.layers.{match[1]}.{block}"
    if match[2] == "gate.weight":
        return [f"{prefix}.gate.weight"]
    parts = (gate, up) if match[2] == "experts.gate_up_proj" else (down,)
    return [f"{prefix}.experts.{e}.{part}.weight" for e in range(cfg.moe.num_experts) for part in parts]
