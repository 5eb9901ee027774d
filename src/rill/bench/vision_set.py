"""The model and the pictures of `rill bench vision`.

The model: `rill-tiny-vision` (the directory shipped in the package) or a local Qwen2-VL /
Qwen2.5-VL directory. In a build without rill-tiny-vision, its name stands for a
random-weight Qwen2VLForConditionalGeneration of its shape (rill.tiny_vision.model.Shape, its
tokenizer and processor configs), made once into the cache directory; the benchmark says so.

The pictures: held-out pictures of the rill-tiny-vision recipe (coloured shapes, counts, numbers,
"left of"), each with its family's question, encoded once as PNG files in memory: every side of the
benchmark starts from the same PNG bytes and the same question.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rill.tiny_vision import tasks

TINY_VISION = "rill-tiny-vision"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / TINY_VISION
RANDOM_NOTE = (f"{TINY_VISION} is not in this build: a random-weight Qwen2-VL of its shape "
               "(rill.tiny_vision.model.Shape), so answers are noise; speed is what counts")
_MODEL_FORMAT = 1  # bump when the way the random model is made changes; old cached directories are ignored
INIT_RANGE = 0.2  # wider than the default 0.02: logits stay apart, so greedy choices are not float noise


@dataclass(frozen=True)
class Picture:
    png: bytes  # the picture as a client sends it
    question: str
    family: str

    def image(self):
        """The PNG decoded to RGB, as a server decodes an upload."""
        from PIL import Image

        return Image.open(io.BytesIO(self.png)).convert("RGB")


def resolve_model(name: str, cache_dir: Path, seed: int) -> tuple[Path, str | None]:
    """(the model directory, a note when it is a random-weight stand-in)."""
    if name != TINY_VISION:
        directory = Path(name)
        if not (directory / "config.json").is_file():
            raise SystemExit(f"no model at {directory}: pass --model DIR (a Qwen2-VL directory)")
        return directory, None
    if (SHIPPED_DIR / "config.json").is_file():
        return SHIPPED_DIR, None
    return make_random_tiny_vision(cache_dir, seed), RANDOM_NOTE


def make_random_tiny_vision(cache_dir: Path, seed: int) -> Path:
    """rill-tiny-vision's shape with random weights, its recipe's tokenizer and processor configs,
    built once into a temporary directory and renamed (an interrupted build leaves nothing behind)."""
    final = Path(cache_dir) / f"random-tiny-vision-seed{seed}-v{_MODEL_FORMAT}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".random-tiny-vision-", dir=final.parent))
    try:
        _write_random_tiny_vision(tmp, seed)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished first
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_random_tiny_vision(out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen2VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from rill.tiny_vision import model as shapes
    from rill.tiny_vision import tokenizer as tok
    from rill.tiny_vision.train import save, tokenizer_texts

    hf_logging.set_verbosity_error()
    shape = shapes.Shape()
    tokenizer = tok.train_tokenizer(tokenizer_texts(seed))
    ids = tok.special_ids(tokenizer)
    config = shapes.qwen2vl_config(shape, tokenizer.get_vocab_size(), ids)
    config.text_config.initializer_range = config.vision_config.initializer_range = INIT_RANGE
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32).eval()
    save(model, tokenizer, shape, ids, out)


def pictures(seed: int, n: int, offset: int = 0) -> list[Picture]:
    """n held-out pictures, the image families in turn; `offset` skips the first ones, so that
    sets drawn at different offsets share no picture (neither cache can serve one from another)."""
    families = tasks.IMAGE_FAMILIES
    per_family = -(-(offset + n) // len(families))
    drawn = {f: tasks.eval_examples(seed, f, per_family) for f in families}
    out = []
    for i in range(offset, offset + n):
        family = families[i % len(families)]
        example = drawn[family][i // len(families)]
        buf = io.BytesIO()
        example.image.save(buf, format="PNG")
        out.append(Picture(buf.getvalue(), example.question, family))
    return out


def messages(question: str) -> list[dict]:
    """The turn as a chat template reads it: the picture, then the question."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
