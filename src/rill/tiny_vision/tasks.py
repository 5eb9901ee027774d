"""rill-tiny-vision's task families: a picture or a short clip, a question, and its one exact answer.

Pictures: "What colour is the circle?", "How many squares are there?", "What number is written?",
"Which shape is left of the star?". Clips: "How many times did the red light flash?", "What digit
was shown last?", and the circle's colour again over a clip (a moving circle), which is what a
client sending an MP4 of a red circle asks. Training questions are sometimes paraphrased; the
evaluation asks the first (canonical) wording.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from rill.tiny_vision import draw
from rill.tiny_vision.splits import EVAL, TRAIN, quadrant, split_of

IMAGE_SIZE = 64  # the image processor resizes pictures to at most IMAGE_SIZE ** 2 pixels
MIN_IMAGE_PIXELS = 2048  # and at least this many (a 48 x 64 picture is kept as it is)
FRAME_SIZE = 32  # clip frames, drawn at this size (the video processor keeps them as they are)
FACTOR = 16  # patch_size 8 x merge_size 2: picture sides are multiples of it
PARAPHRASE_SHARE = 0.3
COUNT_MIXED_SHARE = 0.4  # count pictures whose squares are of several colours
COUNT_SAME_COLOUR_DISTRACTORS = 0.5  # a count picture's other shapes in the squares' colour

QUESTIONS = {
    "colour": ("What colour is the circle?", "What color is the circle?", "Which colour is the circle?"),
    "count": ("How many squares are there?", "How many squares are in the picture?", "Count the squares."),
    "number": ("What number is written?", "What number is shown?", "Read the number."),
    "left_of": ("Which shape is left of the star?", "What shape is to the left of the star?"),
    "flashes": ("How many times did the red light flash?", "How many times did the red light blink?"),
    "last_digit": ("What digit was shown last?", "Which digit was shown last?"),
    "clip_colour": ("What colour is the circle?", "What color is the circle?"),
}
IMAGE_FAMILIES = ("colour", "count", "number", "left_of")
VIDEO_FAMILIES = ("flashes", "last_digit", "clip_colour")
FAMILIES = IMAGE_FAMILIES + VIDEO_FAMILIES
LIGHT_OFF = (70, 70, 70)
ANSWER_WORDS = (*draw.COLOURS, *draw.SHAPES)


@dataclass
class Example:
    family: str
    question: str
    answer: str
    key: str
    image: Image.Image | None = None  # a picture: RGB, any size (the processor resizes it)
    frames: np.ndarray | None = None  # a clip: [T, FRAME_SIZE, FRAME_SIZE, 3] uint8, T even
    labels: np.ndarray | None = None  # a picture's label map: [H, W] uint8 draw.label_code per pixel


def make(rng: random.Random, family: str, split: str) -> Example:
    """One example of `family` whose combination key is in `split` (rejection-sampled)."""
    while True:
        example = _MAKERS[family](rng)
        if split_of(example.key) == split:
            questions = QUESTIONS[family]
            if split == TRAIN and rng.random() < PARAPHRASE_SHARE:
                example.question = rng.choice(questions)
            else:
                example.question = questions[0]
            return example


def _finish(image: Image.Image, label: Image.Image, rng: random.Random) -> tuple[Image.Image, np.ndarray]:
    """Widened on a share, resized to the processor's target (so its own resize leaves it), noise, JPEG;
    the label map follows the picture's geometry."""
    image, label = draw.widen(image, label, rng)
    return draw.finish(image, label, rng, FACTOR, MIN_IMAGE_PIXELS, IMAGE_SIZE * IMAGE_SIZE)


def _picture(family: str, answer: str, key: str, image: Image.Image, label: Image.Image, rng) -> Example:
    image, labels = _finish(image, label, rng)
    return Example(family, "", answer, key, image=image, labels=labels)


def _canvas(rng: random.Random) -> tuple[Image.Image, int]:
    size = rng.choice((64, 80, 96, 128, 160))
    return draw.background(rng, (size, size)), size


def _label_map(image: Image.Image) -> Image.Image:
    """A blank label map for a picture: the glyph and colour codes its drawing calls write."""
    return Image.new("L", image.size, 0)


def _other_colour(rng: random.Random) -> str:
    return rng.choice(tuple(draw.COLOURS))


def _shapes_picture(rng: random.Random, specs: list[tuple[str, str]], radius_range=(0.11, 0.17)):
    """Draw (shape, colour) pairs at random non-overlapping places; returns (image, label map, centres,
    size) or None."""
    image, size = _canvas(rng)
    radii = [rng.uniform(*radius_range) * size for _ in specs]
    centres = draw.place(rng, size, radii)
    if centres is None:
        return None
    label = _label_map(image)
    canvas, pen = ImageDraw.Draw(image), ImageDraw.Draw(label)
    for (shape, colour), (cx, cy), r in zip(specs, centres, radii):
        angle = rng.uniform(-12, 12) if shape == "square" else rng.uniform(0, 360)
        draw.draw_shape(canvas, shape, cx, cy, r, draw.jitter_colour(rng, colour), angle,
                        label=pen, code=draw.label_code(shape, colour))
    return image, label, centres, size


def _colour(rng: random.Random) -> Example:
    while True:
        colour = _other_colour(rng)
        others = [(rng.choice([s for s in draw.SHAPES if s != "circle"]), _other_colour(rng))
                  for _ in range(rng.randint(0, 3))]
        drawn = _shapes_picture(rng, [("circle", colour), *others])
        if drawn:
            image, label, centres, size = drawn
            q = quadrant(*centres[0], size, size)
            return _picture("colour", colour, f"colour|{colour}|{q}", image, label, rng)


def _count(rng: random.Random) -> Example:
    """n squares of one colour (the key: n and the colour), or on a share of pictures of several colours
    (the key: n and the set of colours, "blue+red"); the other shapes take the squares' colour on a share.
    Held out, a count meets a colour it was never drawn in: one colour per picture let the model count per
    colour (87% on training pictures, 30% held out at 13,000 steps); mixed squares and same-coloured
    distractors make it count squares, whatever their colour."""
    while True:
        n = rng.randint(1, 5)
        mixed = n > 1 and rng.random() < COUNT_MIXED_SHARE
        colours = [_other_colour(rng) for _ in range(n)] if mixed else [_other_colour(rng)] * n
        if mixed and len(set(colours)) == 1:
            continue
        distractors = [(rng.choice(("circle", "triangle", "star", "hexagon", "cross")),
                        colours[0] if rng.random() < COUNT_SAME_COLOUR_DISTRACTORS else _other_colour(rng))
                       for _ in range(rng.randint(0, 2))]
        drawn = _shapes_picture(rng, [("square", c) for c in colours] + distractors, radius_range=(0.08, 0.12))
        if drawn:
            key = f"count|{n}|{'+'.join(sorted(set(colours)))}"
            return _picture("count", str(n), key, drawn[0], drawn[1], rng)


def _number(rng: random.Random) -> Example:
    digits = rng.choice((1, 2, 2, 3, 3, 3))
    n = rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)
    image, size = _canvas(rng)
    height = rng.uniform(0.28, 0.42) * size
    ink = rng.choice(("black", "black", "blue", "red", "purple", "brown", "green"))
    width = 0.7 * height * digits
    cx = rng.uniform(width / 2 + 2, size - width / 2 - 2) if width + 4 < size else size / 2
    cy = rng.uniform(height / 2 + 2, size - height / 2 - 2)
    label = _label_map(image)
    draw.draw_text(image, rng, str(n), cx, cy, height, draw.jitter_colour(rng, ink), rng.uniform(-20, 20),
                   label=label, colour_name=ink)
    return _picture("number", str(n), f"number|{n}", image, label, rng)


def _left_of(rng: random.Random) -> Example:
    """2-4 shapes in a loose row; the star is never the leftmost; the answer is its left neighbour."""
    while True:
        count = rng.randint(2, 4)
        slot = rng.randint(1, count - 1)
        names = [rng.choice([s for s in draw.SHAPES if s != "star"]) for _ in range(count)]
        names[slot] = "star"
        image, size = _canvas(rng)
        step = size / count
        r = min(step * 0.38, size * 0.16)
        label = _label_map(image)
        canvas, pen = ImageDraw.Draw(image), ImageDraw.Draw(label)
        row_y = rng.uniform(r + 2, size - r - 2)
        for k, name in enumerate(names):
            cx = step * (k + 0.5) + rng.uniform(-0.08, 0.08) * step
            cy = min(size - r - 1, max(r + 1, row_y + rng.uniform(-0.15, 0.15) * size))
            radius = r * rng.uniform(0.8, 1.0)  # drawn in this order: the recipe's pictures depend on it
            colour = _other_colour(rng)
            fill = draw.jitter_colour(rng, colour)
            draw.draw_shape(canvas, name, cx, cy, radius, fill, rng.uniform(-10, 10),
                            label=pen, code=draw.label_code(name, colour))
        answer = names[slot - 1]
        return _picture("left_of", answer, f"left_of|{answer}|{slot}|{count}", image, label, rng)


# -- clips ---------------------------------------------------------------------------------------------------


def _frame(rng: random.Random, bg) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (FRAME_SIZE * 2, FRAME_SIZE * 2), bg)
    return image, ImageDraw.Draw(image)


def _clip(images: list[Image.Image], rng: random.Random) -> np.ndarray:
    noise = rng.random() < 0.5
    sigma = rng.uniform(2, 8)
    gen = np.random.default_rng(rng.getrandbits(32))
    frames = np.stack([np.asarray(im.resize((FRAME_SIZE, FRAME_SIZE), Image.BICUBIC)) for im in images])
    if noise:
        frames = np.clip(frames + gen.normal(0, sigma, frames.shape), 0, 255).astype(np.uint8)
    return frames


def runs_sequence(rng: random.Random, length: int, runs: int) -> list[bool] | None:
    """`length` on/off states with exactly `runs` runs of on, each 1-3 long, gaps at least 1."""
    states = [False] * rng.randint(0, 2)
    for k in range(runs):
        if k:
            states += [False] * rng.randint(1, 3)
        states += [True] * rng.randint(1, 3)
    if len(states) > length:
        return None
    return states + [False] * (length - len(states))


def _flashes(rng: random.Random) -> Example:
    while True:
        length, k = rng.choice((8, 10, 12, 14, 16)), rng.randint(1, 4)
        states = runs_sequence(rng, length, k)
        if states is not None:
            break
    bg = draw.background(rng, (1, 1)).getpixel((0, 0))
    radii = [rng.uniform(0.14, 0.2) * FRAME_SIZE * 2 for _ in range(2)]
    centres = draw.place(rng, FRAME_SIZE * 2, radii) or [(FRAME_SIZE, FRAME_SIZE), (FRAME_SIZE, FRAME_SIZE)]
    other = rng.random() < 0.5
    other_states = runs_sequence(rng, length, rng.randint(1, 3)) if other else None
    other_colour = draw.jitter_colour(rng, rng.choice(("green", "blue", "yellow")))
    red = draw.jitter_colour(rng, "red")
    images = []
    for t in range(length):
        image, canvas = _frame(rng, bg)
        (x, y), r = centres[0], radii[0]
        draw.draw_shape(canvas, "circle", x, y, r, red if states[t] else LIGHT_OFF)
        if other_states is not None:
            (x2, y2), r2 = centres[1], radii[1]
            draw.draw_shape(canvas, "circle", x2, y2, r2, other_colour if other_states[t] else LIGHT_OFF)
        images.append(image)
    q = quadrant(*centres[0], FRAME_SIZE * 2, FRAME_SIZE * 2)
    return Example("flashes", "", str(k), f"flashes|{k}|{length}|{q}", frames=_clip(images, rng))


def _last_digit(rng: random.Random) -> Example:
    digits = [rng.randint(0, 9) for _ in range(rng.randint(2, 4))]
    bg = draw.background(rng, (1, 1)).getpixel((0, 0))
    images = []
    for d in digits:
        hold = rng.randint(2, 3)
        cx, cy = rng.uniform(24, 40), rng.uniform(24, 40)
        ink = draw.jitter_colour(rng, rng.choice(("black", "blue", "red", "purple")))
        for _ in range(hold):
            image, _ = _frame(rng, bg)
            draw.draw_text(image, rng, str(d), cx, cy, rng.uniform(30, 40), ink, rng.uniform(-15, 15))
            images.append(image)
        if rng.random() < 0.4:
            images.append(_frame(rng, bg)[0])
    if len(images) % 2:
        images.append(images[-1].copy())
    seq = "".join(map(str, digits))
    return Example("last_digit", "", str(digits[-1]), f"last_digit|{seq}", frames=_clip(images, rng))


def _clip_colour(rng: random.Random) -> Example:
    colour = _other_colour(rng)
    length = rng.choice((2, 4, 6, 8))
    bg = draw.background(rng, (1, 1)).getpixel((0, 0))
    size = FRAME_SIZE * 2
    r = rng.uniform(0.18, 0.3) * size
    x, y = rng.uniform(r, size - r), rng.uniform(r, size - r)
    dx, dy = rng.uniform(-3, 3), rng.uniform(-3, 3)
    fill = draw.jitter_colour(rng, colour)
    images = []
    for t in range(length):
        image, canvas = _frame(rng, bg)
        cx = min(size - r, max(r, x + dx * t))
        cy = min(size - r, max(r, y + dy * t))
        draw.draw_shape(canvas, "circle", cx, cy, r, fill)
        images.append(image)
    q = quadrant(x, y, size, size)
    return Example("clip_colour", "", colour, f"clip_colour|{colour}|{q}", frames=_clip(images, rng))


_MAKERS = {
    "colour": _colour, "count": _count, "number": _number, "left_of": _left_of,
    "flashes": _flashes, "last_digit": _last_digit, "clip_colour": _clip_colour,
}


def eval_examples(seed: int, family: str, n: int) -> list[Example]:
    """The held-out set of `family`: deterministic from the seed."""
    return [make(random.Random(f"rill-tiny-vision/{seed}/eval/{family}/{i}"), family, EVAL) for i in range(n)]
