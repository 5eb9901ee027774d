"""Pillow drawing for rill-tiny-vision: shapes, colours, digits in DejaVu fonts, backgrounds, noise, JPEG.

Everything is drawn at a random canvas size and scale, rotated, placed and coloured from a seeded
`random.Random`, so a seed gives the same pictures on every machine (Pillow's rasteriser is
deterministic; the fonts are the DejaVu files matplotlib ships).
"""

from __future__ import annotations

import io
import math
import random
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

COLOURS = {
    "red": (220, 30, 30), "green": (30, 160, 40), "blue": (30, 70, 225), "yellow": (240, 215, 20),
    "orange": (250, 135, 15), "purple": (130, 40, 170), "pink": (250, 120, 190), "brown": (125, 75, 35),
    "black": (20, 20, 20), "gray": (130, 130, 130),
}
SHAPES = ("circle", "square", "triangle", "star", "diamond", "hexagon", "cross")
# What a pixel of a label map holds (training-time supervision of the vision tower): the glyph under it
# (0 background, then the shapes, then the digits) and its ink's colour (0 none, then COLOURS), as one byte.
GLYPHS = ("", *SHAPES, *"0123456789")
COLOUR_NAMES = ("", *COLOURS)
CODE_BASE = len(COLOUR_NAMES)
FONT_FILES = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf",
)


def label_code(glyph: str, colour: str) -> int:
    return GLYPHS.index(glyph) * CODE_BASE + COLOUR_NAMES.index(colour)


@cache
def font_dir() -> Path:
    import matplotlib  # its mpl-data ships the DejaVu family (training-time only)

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@cache
def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_dir() / name), size)


def jitter_colour(rng: random.Random, name: str, amount: int = 18) -> tuple[int, int, int]:
    return tuple(min(255, max(0, c + rng.randint(-amount, amount))) for c in COLOURS[name])


def background(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """White, or a light grey or tint: every colour in COLOURS stays visible on it."""
    if rng.random() < 0.6:
        fill = (255, 255, 255)
    else:
        base = rng.randint(215, 250)
        fill = tuple(min(255, base + rng.randint(-8, 8)) for _ in range(3))
    return Image.new("RGB", size, fill)


def shape_points(shape: str, cx: float, cy: float, r: float, angle_deg: float) -> list[tuple[float, float]]:
    """The outline of `shape` (every shape but the circle) of radius r around (cx, cy), rotated."""
    if shape == "square":
        pts = [(math.cos(math.radians(45 + 90 * k)), math.sin(math.radians(45 + 90 * k))) for k in range(4)]
    elif shape == "diamond":
        pts = [(0, -1), (0.7, 0), (0, 1), (-0.7, 0)]
    elif shape == "triangle":
        pts = [(math.cos(math.radians(-90 + 120 * k)), math.sin(math.radians(-90 + 120 * k))) for k in range(3)]
    elif shape == "hexagon":
        pts = [(math.cos(math.radians(60 * k)), math.sin(math.radians(60 * k))) for k in range(6)]
    elif shape == "star":
        pts = [((1.0 if k % 2 == 0 else 0.45) * math.cos(math.radians(-90 + 36 * k)),
                (1.0 if k % 2 == 0 else 0.45) * math.sin(math.radians(-90 + 36 * k))) for k in range(10)]
    elif shape == "cross":
        a, b = 0.33, 1.0
        pts = [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a),
               (a, b), (-a, b), (-a, a), (-b, a), (-b, -a), (-a, -a)]
    else:
        raise ValueError(shape)
    t = math.radians(angle_deg)
    cos, sin = math.cos(t), math.sin(t)
    return [(cx + r * (x * cos - y * sin), cy + r * (x * sin + y * cos)) for x, y in pts]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, colour, angle_deg: float = 0.0,
               label: ImageDraw.ImageDraw | None = None, code: int = 0):
    """`shape` in `colour`; with `label` (a drawing on the picture's label map), the same outline in `code`."""
    for target, fill in ((draw, colour), (label, code)):
        if target is None:
            continue
        if shape == "circle":
            target.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        else:
            target.polygon(shape_points(shape, cx, cy, r, angle_deg), fill=fill)


def place(rng: random.Random, size: int, radii: list[float], margin: float = 1.0, tries: int = 200):
    """Centres for circles of these radii inside a size x size canvas, not overlapping (None if none found)."""
    centres: list[tuple[float, float]] = []
    for r in radii:
        for _ in range(tries):
            c = (rng.uniform(r + margin, size - r - margin), rng.uniform(r + margin, size - r - margin))
            if all(math.dist(c, o) > r + ro + 2 * margin for o, ro in zip(centres, radii)):
                centres.append(c)
                break
        else:
            return None
    return centres


def draw_text(image: Image.Image, rng: random.Random, text: str, cx: float, cy: float, height: float, colour,
              angle_deg: float, label: Image.Image | None = None, colour_name: str = "") -> None:
    """`text` in a random DejaVu face, about `height` pixels tall, rotated about its centre. With `label`
    (the picture's label map), each character's pixels get its own code there (label_code(char, colour_name))."""
    face = font(rng.choice(FONT_FILES), max(6, int(height)))
    left, top, right, bottom = face.getbbox(text)
    w, h = right - left + 4, bottom - top + 4
    layer = Image.new("L", (w, h), 0)
    ImageDraw.Draw(layer).text((2 - left, 2 - top), text, font=face, fill=255)
    layer = layer.rotate(angle_deg, resample=Image.BICUBIC, expand=True)
    solid = Image.new("RGB", layer.size, colour)
    at = (int(cx - layer.width / 2), int(cy - layer.height / 2))
    image.paste(solid, at, layer)
    if label is not None:
        codes = Image.new("L", (w, h), 0)
        pen = ImageDraw.Draw(codes)
        pen.fontmode = "1"  # no anti-aliasing: a pixel holds one character's code
        for k, char in enumerate(text):
            x = 2 - left + face.getlength(text[:k])
            pen.text((x, 2 - top), char, font=face, fill=label_code(char, colour_name))
        codes = codes.rotate(angle_deg, resample=Image.NEAREST, expand=True)
        label.paste(codes, at, codes.point(lambda v: 255 if v else 0))


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: sides multiples of `factor`, area within [min_pixels, max_pixels], the
    aspect ratio kept as closely as that allows (the image processors' own rule, which they apply
    to every picture; a picture already at its target size is left as it is)."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def widen(image: Image.Image, label: Image.Image, rng: random.Random,
          share: float = 0.25) -> tuple[Image.Image, Image.Image]:
    """On a share of pictures, extend the square canvas with its own background to 4:3 or 3:4, and its
    label map the same way."""
    if rng.random() >= share:
        return image, label
    w, h = image.size
    aspect = rng.choice(((4, 3), (3, 4)))
    new = (w * aspect[0] // min(aspect), h * aspect[1] // min(aspect))
    canvas = Image.new("RGB", new, image.getpixel((0, 0)))
    wide = Image.new("L", new, 0)
    at = (rng.randint(0, new[0] - w), rng.randint(0, new[1] - h))
    canvas.paste(image, at)
    wide.paste(label, at)
    return canvas, wide


def finish(image: Image.Image, label: Image.Image, rng: random.Random, factor: int, min_pixels: int,
           max_pixels: int, noise: float = 0.5, jpeg: float = 0.5) -> tuple[Image.Image, np.ndarray]:
    """Resize to the processor's target size (a size it then keeps), then Gaussian noise and JPEG
    re-encoding, each on a share of pictures; the label map resized alike, as a uint8 array."""
    height, width = smart_resize(image.height, image.width, factor, min_pixels, max_pixels)
    if image.size != (width, height):
        image = image.resize((width, height), Image.BICUBIC)
    codes = np.asarray(label.resize((width, height), Image.NEAREST), dtype=np.uint8)
    if rng.random() < noise:
        sigma = rng.uniform(2, 12)
        arr = np.asarray(image, dtype=np.float32)
        gen = np.random.default_rng(rng.getrandbits(32))
        arr = arr + gen.normal(0, sigma, arr.shape)
        image = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if rng.random() < jpeg:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=rng.randint(35, 95))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return image, codes
