"""M-RoPE positions of a prompt with images and video, as transformers' Qwen2-VL get_rope_index.

Text tokens count up by one in all three streams. An item's tokens start at the current position p:
time p + floor(frame * time_interval), row p + r, column p + c over its merged grid; the text after
it continues at p + max(rows, columns) (transformers 5's rule). Tokens past the prompt the layout was
made for (generated tokens, streamed text) sit at i + delta in every stream, delta = max + 1 - N,
as transformers' generate places decode steps.
"""

from __future__ import annotations

import torch

from rill.multimodal.inputs import MultiModalItem


class MRopeLayout:
    """The three position streams of a sequence's first `num_tokens` tokens, and the delta after."""

    def __init__(self, num_tokens: int, items: list[MultiModalItem], merge_size: int):
        streams = torch.empty(3, num_tokens, dtype=torch.int64)
        pos = index = 0
        for item in sorted(items, key=lambda it: it.offset):
            n = item.offset - index
            streams[:, index : item.offset] = torch.arange(pos, pos + n)
            pos, index = pos + n, item.offset
            t, h, w = item.grid_thw[0], item.grid_thw[1] // merge_size, item.grid_thw[2] // merge_size
            times = (torch.arange(t) * item.time_interval).long()
            grid = torch.stack(torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")).flatten(1)
            streams[:, index : item.end] = grid + pos
            pos, index = pos + max(h, w), item.end
        streams[:, index:] = torch.arange(pos, pos + num_tokens - index)
        self.num_tokens = num_tokens
        self.streams = streams
        self.delta = int(streams.max()) + 1 - num_tokens if num_tokens else 0

    def positions(self, begin: int, end: int) -> torch.Tensor:
        """[3, end - begin] positions of tokens [begin, end)."""
        inside = min(end, self.num_tokens)
        head = self.streams[:, begin:inside] if begin < inside else self.streams[:, :0]
        start = max(begin, self.num_tokens)
        if start >= end:
            return head
        tail = torch.arange(start + self.delta, end + self.delta).expand(3, -1)
        return torch.cat([head, tail], dim=1)
