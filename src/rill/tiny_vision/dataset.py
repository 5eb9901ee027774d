"""Training and evaluation examples as model inputs: token ids, labels and pixel patches.

Every example is rendered as the chat template renders a user turn holding the picture or clip and
the question (the picture first, or on a share of training examples the question first, as clients
send either order), followed by the answer and <|im_end|>. <|image_pad|> / <|video_pad|> are
expanded to the picture's or clip's token count as Qwen2VLProcessor expands them.

Training examples are drawn on the fly by worker processes, each a function of (seed, index) alone,
a few steps ahead of the optimizer (bounded, so memory stays flat).
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from rill.tiny.workers import context as workers_context
from rill.tiny_vision import draw, tasks
from rill.tiny_vision import model as shapes
from rill.tiny_vision import tokenizer as tok
from rill.tiny_vision.splits import TRAIN

TEXT_FIRST_SHARE = 0.25
STEPS_AHEAD = 4
MIN_TARGET_PIXELS = 6  # of a patch's 64: a 6-pixel square split over four patches still names them


@dataclass
class Encoded:
    family: str
    ids: list[int]  # the whole turn, placeholders expanded
    num_prompt: int  # ids before the answer
    pixels: torch.Tensor  # [num_patches, patch_dim]
    grid_thw: list[int]
    is_video: bool
    targets: torch.Tensor | None = None  # a picture's [num_patches, 2] (glyph, colour) per patch (patch_targets)


def prompt_text(example: tasks.Example, text_first: bool = False) -> str:
    """What CHAT_TEMPLATE renders for the one user turn, with the generation prompt."""
    pad = tok.VIDEO_PAD if example.frames is not None else tok.IMAGE_PAD
    media = f"{tok.VISION_START}{pad}{tok.VISION_END}"
    body = example.question + media if text_first else media + example.question
    return f"{tok.IM_START}user\n{body}{tok.IM_END}\n{tok.IM_START}assistant\n"


def messages(example: tasks.Example, text_first: bool = False) -> list[dict]:
    """The same turn as chat messages (transformers' content parts)."""
    media = {"type": "video"} if example.frames is not None else {"type": "image"}
    text = {"type": "text", "text": example.question}
    return [{"role": "user", "content": [text, media] if text_first else [media, text]}]


def pixels_of(example: tasks.Example, shape: shapes.Shape) -> tuple[torch.Tensor, list[int]]:
    frames = example.frames if example.frames is not None else np.asarray(example.image)[None]
    return shapes.patches(frames, shape)


def patch_targets(labels: np.ndarray, shape: shapes.Shape, min_pixels: int = MIN_TARGET_PIXELS) -> torch.Tensor:
    """What each patch of a picture shows, from its label map, in the order of the picture's patches
    (shapes.patches: 2 x 2 merge groups, row-major): [num_patches, 2] (glyph, colour) indices into
    draw.GLYPHS and draw.COLOUR_NAMES. A patch gets the code most of its drawn pixels carry, when at
    least `min_pixels` of them are drawn; otherwise background (0, 0)."""
    p, m = shape.patch_size, shape.merge_size
    gh, gw = labels.shape[0] // p, labels.shape[1] // p
    cells = labels.reshape(gh, p, gw, p).transpose(0, 2, 1, 3).reshape(gh * gw, p * p)
    codes = np.zeros(gh * gw, dtype=np.int64)
    for k, cell in enumerate(cells):
        counts = np.bincount(cell)
        counts[0] = 0
        best = int(counts.argmax())
        if counts[best] >= min_pixels:
            codes[k] = best
    codes = codes.reshape(gh // m, m, gw // m, m).transpose(0, 2, 1, 3).reshape(-1)
    return torch.from_numpy(np.stack([codes // draw.CODE_BASE, codes % draw.CODE_BASE], axis=1))


def encode(example: tasks.Example, tokenizer: Tokenizer, shape: shapes.Shape, text_first: bool = False) -> Encoded:
    pixels, grid = pixels_of(example, shape)
    prompt = tokenizer.encode(prompt_text(example, text_first), add_special_tokens=False).ids
    answer = tokenizer.encode(example.answer + tok.IM_END, add_special_tokens=False).ids
    pad_id = tokenizer.token_to_id(tok.VIDEO_PAD if example.frames is not None else tok.IMAGE_PAD)
    count = grid[0] * grid[1] * grid[2] // shape.merge_size**2
    at = prompt.index(pad_id)
    prompt = prompt[:at] + [pad_id] * count + prompt[at + 1:]
    targets = patch_targets(example.labels, shape) if example.labels is not None else None
    return Encoded(example.family, prompt + answer, len(prompt), pixels, grid, example.frames is not None, targets)


def train_example(seed: int, index: int, weights: dict[str, float] | None = None) -> tuple[tasks.Example, bool]:
    """Example `index` of the seed's stream; `weights` (family: relative weight, 1 where not named) draws
    some families more often than others (None: all alike, the stream of every earlier phase)."""
    rng = random.Random(f"rill-tiny-vision/{seed}/train/{index}")
    if weights is None:
        family = rng.choice(tasks.FAMILIES)
    else:
        family = rng.choices(tasks.FAMILIES, [weights.get(f, 1.0) for f in tasks.FAMILIES])[0]
    return tasks.make(rng, family, TRAIN), rng.random() < TEXT_FIRST_SHARE


def parse_family_weights(text: str) -> dict[str, float]:
    """"count=3,number=2" -> {"count": 3.0, "number": 2.0}; an unknown family, a weight < 0 or
    not finite, or every family at 0 is an error."""
    weights = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        family, sep, value = item.partition("=")
        if not sep or family not in tasks.FAMILIES:
            raise ValueError(f"{item!r}: expected FAMILY=WEIGHT with FAMILY one of {', '.join(tasks.FAMILIES)}")
        weights[family] = float(value)
        if not 0 <= weights[family] < float("inf"):
            raise ValueError(f"{item!r}: a weight is a finite number >= 0")
    if weights and not any(weights.get(f, 1.0) > 0 for f in tasks.FAMILIES):
        raise ValueError("every family's weight is 0")
    return weights


_WORKER: dict = {}


def _init(tokenizer_json: str, shape: shapes.Shape, seed: int, weights: dict[str, float] | None) -> None:
    torch.set_num_threads(1)
    _WORKER.update(tokenizer=Tokenizer.from_str(tokenizer_json), shape=shape, seed=seed, weights=weights)


def _encode_range(start: int, stop: int) -> list[Encoded]:
    out = []
    for index in range(start, stop):
        example, text_first = train_example(_WORKER["seed"], index, _WORKER["weights"])
        out.append(encode(example, _WORKER["tokenizer"], _WORKER["shape"], text_first))
    return out


class Stream:
    """Batch after batch of training examples, drawn by `workers` processes STEPS_AHEAD steps ahead,
    from example `first` of the stream on (a later phase starts past the examples its earlier ones saw)."""

    def __init__(self, seed: int, batch_size: int, tokenizer: Tokenizer, shape: shapes.Shape, workers: int,
                 first: int = 0, weights: dict[str, float] | None = None):
        self.batch_size = batch_size
        self.first = first
        self.pool = workers_context().Pool(
            max(1, workers), initializer=_init, initargs=(tokenizer.to_str(), shape, seed, weights or None))
        self.pending: collections.deque = collections.deque()
        self.next_step = 0

    def _submit(self) -> None:
        # a batch in pieces, one per worker, so several workers share one step
        size = self.batch_size
        start = self.first + self.next_step * size
        pieces = [(start + k, min(start + size, start + k + 8)) for k in range(0, size, 8)]
        self.pending.append([self.pool.apply_async(_encode_range, piece) for piece in pieces])
        self.next_step += 1

    def next(self) -> list[Encoded]:
        while len(self.pending) < STEPS_AHEAD:
            self._submit()
        return [e for result in self.pending.popleft() for e in result.get()]

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


def collate(batch: list[Encoded], pad_id: int, image_pad: int, video_pad: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, labels on the answers, mm_token_type_ids, the pictures' and clips' patches, and
    the pictures' patch targets (patch_targets, when every picture has them)."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, e in enumerate(batch):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
        mask[row, : len(e.ids)] = 1
        labels[row, e.num_prompt - 1 : len(e.ids) - 1] = torch.tensor(e.ids[e.num_prompt:])
    types = (ids == image_pad).long() + 2 * (ids == video_pad).long()
    out = {"input_ids": ids, "attention_mask": mask, "labels": labels, "mm_token_type_ids": types}
    images = [e for e in batch if not e.is_video]
    videos = [e for e in batch if e.is_video]
    if images:
        out["pixel_values"] = torch.cat([e.pixels for e in images])
        out["image_grid_thw"] = torch.tensor([e.grid_thw for e in images])
        if all(e.targets is not None for e in images):
            out["patch_targets"] = torch.cat([e.targets for e in images])
    if videos:
        out["pixel_values_videos"] = torch.cat([e.pixels for e in videos])
        out["video_grid_thw"] = torch.tensor([e.grid_thw for e in videos])
    return out
