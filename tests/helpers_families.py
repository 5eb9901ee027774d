"""Random-weight Phi-3, Mixtral and Qwen3-MoE models built with transformers (the oracle)."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers_models import save_random_model

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, initializer_range=0.2, eos_token_id=None, bos_token_id=None,
             pad_token_id=None)

# LongRoPE over head_dim 16 (8 frequencies), pretrained length 32: prompts past 32 tokens take the long factors.
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0],
            "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]}
LONGROPE_ORIGINAL = 32


def family_config(kind: str, vocab_size: int):
    from transformers import MixtralConfig, Phi3Config, Qwen3MoeConfig

    kinds = {
        "phi3": lambda: Phi3Config(intermediate_size=128, sliding_window=24, **SMALL),
        "phi3-longrope": lambda: Phi3Config(intermediate_size=128, rope_parameters=dict(LONGROPE),
                                            original_max_position_embeddings=LONGROPE_ORIGINAL, **SMALL),
        "mixtral": lambda: MixtralConfig(intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                                         sliding_window=24, **SMALL),
        # layer 1 keeps a dense MLP; top-3 of 8 without renormalization
        "qwen3-moe": lambda: Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                            num_experts_per_tok=3, mlp_only_layers=[1], head_dim=32,
                                            **{**SMALL, "num_hidden_layers": 3}),
        # renormalized top-2 of 6, a window on every layer, every other layer sparse
        "qwen3-moe-window": lambda: Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=6,
                                                   num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                                                   use_sliding_window=True, sliding_window=24, **SMALL),
    }
    return kinds[kind]()


def make_family_dir(path: Path, kind: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    """Save a random model of `kind` with a ByteLevel BPE tokenizer and a ChatML template."""
    return save_random_model(path, lambda vocab_size: family_config(kind, vocab_size), dtype, seed)
