"""Data shipped inside the package: the embedded rill-tiny model."""

from pathlib import Path

RILL_TINY_DIR = Path(__file__).parent / "rill-tiny"
