"""Data shipped inside the package: the embedded rill-tiny model and rill-tiny-vision."""

import os
from pathlib import Path

RILL_TINY_DIR = Path(__file__).parent / "rill-tiny"
RILL_TINY_VISION = "rill-tiny-vision"


def tiny_vision_dir() -> Path:
    """Where rill-tiny-vision is looked for: RILL_TINY_VISION_DIR, else beside rill-tiny in the package.
    It is trained by its own recipe and absent from builds that do not ship it."""
    return Path(os.environ.get("RILL_TINY_VISION_DIR") or Path(__file__).parent / RILL_TINY_VISION)
