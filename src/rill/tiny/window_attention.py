"""Sliding-window attention for training, in query chunks.

`transformers`' sdpa path builds a dense (seq x seq) mask and attends every query to every key,
although a query sees at most `sliding_window` keys. Here each chunk of queries attends only to
the keys its window can reach, so a 1024-token row with a 640-token window does about 2/3 of the
work (measured: 1.75 s against 2.4 s a step at 8 x 1024 on 2 CPU cores). Same maths, same
gradients (tests/test_tiny_recipe.py compares it with sdpa).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "rill_window_chunks"
QUERY_CHUNK = 128


def window_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                     **kwargs):
    """`transformers` attention interface: (batch, heads, seq, dim) in, (batch, seq, heads, dim) out;
    the caller passes dropout 0.0 outside training.
    Causal within unpadded rows only (training packs full rows, so there is no padding mask)."""
    if attention_mask is not None:
        raise ValueError(f"{NAME} serves unpadded causal training rows; got an attention mask")
    seq = query.shape[2]
    window = sliding_window or seq
    gqa = key.shape[1] != query.shape[1]
    outs = []
    for start in range(0, seq, QUERY_CHUNK):
        end = min(seq, start + QUERY_CHUNK)
        first = max(0, start - window + 1)
        rows = torch.arange(start, end, device=query.device)[:, None]
        cols = torch.arange(first, end, device=query.device)[None, :]
        visible = (cols <= rows) & (cols > rows - window)
        outs.append(F.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, first:end], value[:, :, first:end],
            attn_mask=visible, dropout_p=dropout, scale=scaling,
            enable_gqa=gqa,
        ))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, window_attention)
    return NAME
