"""M-RoPE positions of a prompt with images and video, as transformers' Qwen2-VL get_rope_index.

Text tokens count up by one in all three streams. An item's tokens start at the current position p:
time p + floor(frame * time_interval), row p + r, column p + c over its merged grid; the text after
it continues at p + max(rows, columns) (transformers 5's rule). Tokens past the prompt the layout was
made for (generated tokens, streamed text) sit at i + delta in every stream, delta = max + 1 - N,
as transformers' generate places decode steps.

A live video's pieces (items with `continues`, rill.live_video) are laid out as one video: each piece
starts where the video started, its times after the frames of the pieces before it.
"""

from __future__ import annotations

import torch

from rill.multimodal.inputs import MultiModalItem


class MRopeLayout:
    """The three position streams of a sequence's first `num_tokens` tokens, and the delta after."""

    def __init__(self, num_tokens: int, items: list[MultiModalItem], merge_size: int):
        streams = torch.empty(3, num_tokens, dtype=torch.int64)
        pos = index = 0
        video = None  # (start position, temporal patches laid out) of the item a piece may continue
        for item in sorted(items, key=lambda it: it.offset):
            n = item.offset - index
            streams[:, index : item.offset] = torch.arange(pos, pos + n)
            pos, index = pos + n, item.offset
            # a live video's next piece: the same start, its frames after the pieces before it
            start, t0 = video if item.continues and video is not None and n == 0 else (pos, 0)
            t, h, w = item.grid_thw[0], item.grid_thw[1] // merge_size, item.grid_thw[2] // merge_size
            times = (torch.arange(t0, t0 + t) * item.time_interval).long()
            grid = torch.stack(torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")).flatten(1)
            streams[:, index : item.end] = grid + start
            pos, index, video = start + max(h, w), item.end, (start, t0 + t)
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
