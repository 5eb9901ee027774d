"""A LLaVA prompt's images: pixels processed, `<image>` placeholders expanded, items placed.

The chat template writes one `<image>` token per image; transformers' LlavaProcessor repeats it
tokens_per_image times (the tower's patches, plus CLIP's class token, less the first token under the
"default" feature strategy), and so does `expand` here (the same matching as Qwen2-VL's). LLaVA
reads no video: a video is a 400 naming the part.
"""

from __future__ import annotations

from pathlib import Path

from rill.errors import ValidationError
from rill.models.llava_config import LlavaVisionConfig
from rill.multimodal.inputs import IMAGE, MultiModalItem, content_hash
from rill.multimodal.llava_processor import LlavaPixelConfig, process_image
from rill.multimodal.qwen2_vl_inputs import Qwen2VLInputs


class LlavaInputs:
    def __init__(self, vision: LlavaVisionConfig, pixel_cfg: LlavaPixelConfig):
        self.vision, self.pixel_cfg = vision, pixel_cfg

    @classmethod
    def from_dir(cls, model_dir: Path, vision: LlavaVisionConfig) -> LlavaInputs:
        return cls(vision, LlavaPixelConfig.from_dir(model_dir))

    def placeholder(self, kind: str) -> int:
        if kind != IMAGE:
            raise ValidationError(f"this LLaVA model reads images, not {kind}s", code="unsupported")
        return self.vision.image_token_id

    def num_image_tokens(self, width: int, height: int) -> int:
        return self.vision.tokens_per_image

    def item(self, kind: str, media) -> MultiModalItem:
        """One image (a PIL image) processed, its offset still to set."""
        self.placeholder(kind)
        pixels = process_image(media, self.pixel_cfg)
        size = self.vision.tower.image_size
        if tuple(pixels.shape[-2:]) != (size, size):
            raise ValidationError(f"preprocessor_config.json gives {tuple(pixels.shape[-2:])} pixels; the vision "
                                  f"tower reads {size}x{size}", code="invalid_image")
        p = self.vision.tower.patch_size
        grid = (1, size // p, size // p)
        n = self.vision.tokens_per_image
        return MultiModalItem(IMAGE, content_hash(IMAGE, grid, pixels), 0, n, grid, pixels)

    expand = Qwen2VLInputs.expand  # only this model's image placeholders are looked up
