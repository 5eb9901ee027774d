"""What rill-tiny-vision trains on and what only its evaluation sees.

Each example has a combination key (the circle's colour and quadrant, the number written, the
sequence of digits shown, ...). One key in five, chosen by a stable hash (crc32, as rill.tiny.splits),
is held out of training; evaluation draws only held-out keys, so it measures generalisation to
combinations the model never saw, not recall.
"""

from __future__ import annotations

import zlib

TRAIN = "train"
EVAL = "eval"
HOLD_OUT_ONE_IN = 5


def split_of(key: str) -> str:
    return EVAL if zlib.crc32(key.encode()) % HOLD_OUT_ONE_IN == 0 else TRAIN


def quadrant(x: float, y: float, width: float, height: float) -> int:
    """0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right."""
    return (2 if y >= height / 2 else 0) + (1 if x >= width / 2 else 0)
