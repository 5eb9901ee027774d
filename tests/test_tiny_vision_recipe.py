"""rill-tiny-vision's recipe: pictures and clips deterministic from the seed, held-out combination keys,
answers true by construction, pixels as transformers' processors make them, a template transformers
renders as the recipe does, a training smoke run that transformers and rill's engine both run (greedy
equal), and the shipped model's held-out table."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from rill.tiny_vision import dataset, draw, evaluate, splits, tasks
from rill.tiny_vision import model as shapes
from rill.tiny_vision import tokenizer as tok
from rill.tiny_vision import train as recipe

torch.set_num_threads(1)
ASSETS = evaluate.DEFAULT_MODEL_DIR
PICTURES_DIGEST = "8215cd26105fc3926a41d7f2a473e5c95aba908f"  # colour, number, left_of
SMOKE_SHAPE = dict(vision_dim=32, vision_depth=1, vision_heads=2, hidden_size=32, layers=1, heads=2, kv_heads=1,
                   intermediate_size=64)


def _examples(split: str, n: int, seed: int = 0) -> list[tasks.Example]:
    rng = random.Random(seed)
    return [tasks.make(rng, tasks.FAMILIES[i % len(tasks.FAMILIES)], split) for i in range(n)]


def test_same_seed_gives_the_same_pictures_and_clips():
    for a, b in zip(_examples(splits.TRAIN, 14, seed=3), _examples(splits.TRAIN, 14, seed=3)):
        assert (a.question, a.answer, a.key) == (b.question, b.answer, b.key)
        if a.image is not None:
            assert a.image.tobytes() == b.image.tobytes()
        else:
            assert np.array_equal(a.frames, b.frames)
    keys = [e.key for e in tasks.eval_examples(0, "number", 20)]
    assert keys == [e.key for e in tasks.eval_examples(0, "number", 20)]


def test_training_never_draws_a_held_out_combination_and_evaluation_only_those():
    assert all(splits.split_of(e.key) == splits.TRAIN for e in _examples(splits.TRAIN, 140))
    for family in tasks.FAMILIES:
        held = tasks.eval_examples(0, family, 10)
        assert all(splits.split_of(e.key) == splits.EVAL for e in held)
        assert all(e.question == tasks.QUESTIONS[family][0] for e in held)  # the canonical wording


def test_answers_are_true_by_construction():
    for e in _examples(splits.TRAIN, 70) + [x for f in tasks.FAMILIES for x in tasks.eval_examples(1, f, 5)]:
        fields = e.key.split("|")
        assert fields[0] == e.family
        if e.family in ("colour", "clip_colour"):
            assert e.answer == fields[1] and e.answer in draw.COLOURS
        elif e.family in ("count", "flashes"):
            assert e.answer == fields[1] and 1 <= int(e.answer) <= (5 if e.family == "count" else 4)
        elif e.family == "number":
            assert e.answer == fields[1] and 0 <= int(e.answer) <= 999
        elif e.family == "left_of":
            assert e.answer in draw.SHAPES and e.answer != "star"
        elif e.family == "last_digit":
            assert e.answer == fields[1][-1]


def test_counting_pictures_mix_colours_on_a_share():
    """Squares of several colours on some pictures (the key names the set), distractors in the squares'
    colour on some; the label map holds exactly the squares' colours, as the key says."""
    examples = [tasks.make(random.Random(f"count/{i}"), "count", splits.TRAIN) for i in range(60)]
    mixed = [e for e in examples if "+" in e.key]
    assert 10 <= len(mixed) <= 40
    square = draw.GLYPHS.index("square")
    for e in examples:
        codes = np.unique(e.labels[e.labels // draw.CODE_BASE == square]) % draw.CODE_BASE
        assert {draw.COLOUR_NAMES[c] for c in codes} == set(e.key.split("|")[2].split("+"))
        assert int(e.answer) >= len(codes)


def test_family_weights_draw_the_named_families_more_often_and_none_keeps_the_earlier_stream():
    for i in range(20):  # without weights: the stream every earlier phase drew
        rng = random.Random(f"rill-tiny-vision/0/train/{i}")
        assert dataset.train_example(0, i)[0].key == tasks.make(rng, rng.choice(tasks.FAMILIES), splits.TRAIN).key
    weights = dataset.parse_family_weights("count=6, flashes=0,last_digit=0,clip_colour=0")
    assert weights == {"count": 6.0, "flashes": 0.0, "last_digit": 0.0, "clip_colour": 0.0}
    drawn = [dataset.train_example(0, i, weights)[0].family for i in range(120)]
    assert set(drawn) <= set(tasks.IMAGE_FAMILIES) and drawn.count("count") > 60  # 6/9 of them, on average


@pytest.mark.parametrize("text", ["counting=2", "count", "count=-1", "count=x", "count=nan", "count=inf",
                                  "colour=0,count=0,number=0,left_of=0,flashes=0,last_digit=0,clip_colour=0"])
def test_family_weights_refuse_what_they_cannot_draw(text):
    with pytest.raises(ValueError):
        dataset.parse_family_weights(text)
    with pytest.raises(SystemExit):
        recipe.parse_args(["--out", "x", "--family-weights", text])


def test_a_later_phase_draws_the_stream_from_its_first_example_on(tokenizer):
    stream = dataset.Stream(0, 3, tokenizer, shapes.Shape(), workers=1, first=9)
    try:
        drawn = stream.next()
    finally:
        stream.close()
    expected = []
    for index in range(9, 12):
        example, text_first = dataset.train_example(0, index)
        expected.append(dataset.encode(example, tokenizer, shapes.Shape(), text_first).ids)
    assert [e.ids for e in drawn] == expected


@pytest.mark.parametrize("runs", [1, 2, 3, 4])
def test_flash_sequences_have_exactly_the_counted_runs(runs):
    rng = random.Random(runs)
    for _ in range(50):
        states = tasks.runs_sequence(rng, 16, runs)
        if states is not None:
            assert len(states) == 16
            assert sum(1 for i, s in enumerate(states) if s and (i == 0 or not states[i - 1])) == runs


def test_clips_are_even_uint8_frames_of_the_frame_size():
    for e in _examples(splits.TRAIN, 70):
        if e.frames is not None:
            t, h, w, c = e.frames.shape
            assert t % 2 == 0 and (h, w, c) == (tasks.FRAME_SIZE, tasks.FRAME_SIZE, 3) and e.frames.dtype == np.uint8


def test_picture_pixels_equal_transformers_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    config = shapes.image_processor_config(shapes.Shape())
    processor = Qwen2VLImageProcessorPil(**{k: v for k, v in config.items()
                                            if k not in ("image_processor_type", "processor_class", "min_pixels",
                                                         "max_pixels")})
    pictures = [e for e in _examples(splits.TRAIN, 120) if e.image is not None]
    assert {e.image.size for e in pictures} >= {(64, 64), (48, 64), (64, 48)}  # square and 4:3 both ways
    for e in pictures:
        expected = processor(images=[e.image], return_tensors="pt")
        ours, grid = dataset.pixels_of(e, shapes.Shape())
        assert expected["image_grid_thw"][0].tolist() == grid  # the picture is at a size the processor keeps
        torch.testing.assert_close(ours, expected["pixel_values"], rtol=0, atol=1e-6)


def test_clip_pixels_equal_rills_video_processor():
    from rill.multimodal.qwen2_vl_processor import PixelConfig, process_video

    cfg = PixelConfig.from_dict(shapes.video_processor_config(shapes.Shape()))
    for e in _examples(splits.TRAIN, 70):
        if e.frames is not None:
            ours, grid = dataset.pixels_of(e, shapes.Shape())
            theirs = process_video(e.frames, cfg)
            assert tuple(grid) == theirs.grid_thw
            torch.testing.assert_close(ours, theirs.values, rtol=0, atol=1e-5)


def _glyphs_drawn(e: tasks.Example) -> set[tuple[str, str]]:
    return {(draw.GLYPHS[v // draw.CODE_BASE], draw.COLOUR_NAMES[v % draw.CODE_BASE]) for v in np.unique(e.labels) if v}


def test_label_maps_hold_what_each_picture_shows_where_it_shows_it():
    """Every picture carries a label map (the patch probe's targets) at its own size, naming what was
    drawn, and its drawn pixels are where the picture's ink is."""
    pictures = [e for e in _examples(splits.TRAIN, 160) if e.image is not None]
    assert {e.family for e in pictures} == set(tasks.IMAGE_FAMILIES)
    for e in pictures:
        assert e.labels.shape == (e.image.height, e.image.width) and e.labels.dtype == np.uint8
        drawn = _glyphs_drawn(e)
        glyphs = {g for g, _ in drawn}
        if e.family == "colour":
            assert ("circle", e.answer) in drawn
        elif e.family == "count":
            assert "square" in glyphs
        elif e.family == "number":
            assert glyphs <= set(e.answer) and len(glyphs) >= len(set(e.answer)) - 1  # a thin "1" can round away
        else:
            assert {"star", e.answer} <= glyphs
        pixels = np.asarray(e.image, dtype=np.float32)
        background = np.median(pixels[e.labels == 0], axis=0)
        away = np.abs(pixels - background).sum(-1)
        assert away[e.labels > 0].mean() > 4 * away[e.labels == 0].mean(), e.key


def test_the_label_maps_leave_the_pictures_as_they_were():
    """Drawing labels takes nothing from the random stream: the recipe's pictures did not change
    (this digest is of the pictures before label maps existed; counting's pictures changed since)."""
    import hashlib

    digest = hashlib.sha1()
    for family in ("colour", "number", "left_of"):
        for i in range(10):
            e = tasks.make(random.Random(f"labels/{family}/{i}"), family, splits.TRAIN)
            digest.update(e.key.encode() + e.image.tobytes())
    assert digest.hexdigest() == PICTURES_DIGEST


def test_patch_targets_follow_the_patch_order():
    """Patch k's target names the label map's patch that shapes.patches puts at row k (2 x 2 merge groups)."""
    shape = shapes.Shape()
    p = shape.patch_size
    for height, width in ((64, 64), (48, 64), (64, 48)):
        gh, gw = height // p, width // p
        raster = np.arange(1, gh * gw + 1, dtype=np.uint8).reshape(gh, gw)  # each patch's raster number
        labels = np.kron(raster, np.ones((p, p), dtype=np.uint8))
        targets = dataset.patch_targets(labels, shape)
        codes = (targets[:, 0] * draw.CODE_BASE + targets[:, 1]).numpy()
        frame = np.repeat(labels[..., None], 3, axis=-1)  # the same numbers as pixels, through the real patching
        pixels, grid = shapes.patches(frame[None], shape)
        first = pixels.view(len(pixels), 3, shape.temporal_patch_size, p * p)[:, 0, 0, 0]
        mean, std = shapes.CLIP_MEAN[0], shapes.CLIP_STD[0]
        assert grid == [1, gh, gw]
        assert np.array_equal(codes, np.rint((first.numpy() * std + mean) * 255).astype(int))


def test_patch_targets_ignore_a_few_stray_pixels():
    labels = np.zeros((16, 16), dtype=np.uint8)
    code = draw.label_code("star", "red")
    labels[0:2, 0:2] = code  # 4 pixels of patch 0: background
    labels[0:3, 8:10] = code  # 6 of patch 1: the star
    targets = dataset.patch_targets(labels, shapes.Shape())
    assert targets[0].tolist() == [0, 0]
    assert targets[1].tolist() == [draw.GLYPHS.index("star"), draw.COLOUR_NAMES.index("red")]


@pytest.fixture(scope="module")
def tokenizer():
    return tok.train_tokenizer(recipe.tokenizer_texts(0, 400))


def test_tokenizer_has_qwen2_vl_special_tokens_and_single_digit_numbers(tokenizer):
    for token in tok.SPECIAL_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False).ids == [tokenizer.token_to_id(token)]
    assert len(tokenizer.encode("472", add_special_tokens=False).ids) == 3
    for word in tasks.ANSWER_WORDS:  # one token each: the first answer token names the answer
        assert len(tokenizer.encode(word, add_special_tokens=False).ids) == 1, word
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is the circle?<|im_end|>\n"
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("text_first", [False, True])
def test_transformers_renders_the_chat_template_as_the_recipe_does(tmp_path, tokenizer, text_first):
    from transformers import AutoTokenizer

    tok.save_tokenizer(tokenizer, tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    for e in _examples(splits.TRAIN, 14):
        rendered = hf.apply_chat_template(dataset.messages(e, text_first), add_generation_prompt=True, tokenize=False)
        assert rendered == dataset.prompt_text(e, text_first)
    plain = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-vision")
    args = ["--out", str(out), "--steps", "3", "--batch-size", "6", "--warmup", "1", "--threads", "1"]
    for name, value in SMOKE_SHAPE.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    assert recipe.main(args) == 0
    return out


def test_training_writes_a_directory_transformers_loads(smoke_dir):
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    record = json.loads((smoke_dir / "training_run.json").read_text())
    assert record["steps"] == 3 and record["examples_seen"] == 18 and len(record["losses_every_10_steps"]) == 2
    model = Qwen2VLForConditionalGeneration.from_pretrained(smoke_dir)
    assert model.config.vision_config.patch_size == 8 and model.config.image_token_id == 5
    assert AutoTokenizer.from_pretrained(smoke_dir).convert_tokens_to_ids("<|video_pad|>") == 6
    assert AutoImageProcessor.from_pretrained(smoke_dir).size["longest_edge"] == tasks.IMAGE_SIZE**2
    assert (smoke_dir / "video_preprocessor_config.json").is_file()


def test_the_patch_probe_trains_beside_the_model_and_is_not_saved(smoke_dir, tmp_path):
    from safetensors.torch import load_file

    record = json.loads((smoke_dir / "training_run.json").read_text())
    assert record["probe_weight"] == 1.0 and len(record["probe_losses_every_10_steps"]) == 2
    assert all(math.isfinite(x) and x > 0 for x in record["probe_losses_every_10_steps"])
    args = ["--out", str(tmp_path / "plain"), "--steps", "1", "--batch-size", "4", "--warmup", "1", "--threads", "1",
            "--probe-weight", "0"]
    for name, value in SMOKE_SHAPE.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    assert recipe.main(args) == 0
    assert json.loads((tmp_path / "plain" / "training_run.json").read_text())["probe_losses_every_10_steps"] == []
    with_probe = load_file(smoke_dir / "model.safetensors")
    # the heads are training-only
    assert with_probe.keys() == load_file(tmp_path / "plain" / "model.safetensors").keys()


def test_a_second_phase_starts_from_the_earlier_runs_weights(smoke_dir, tmp_path):
    from safetensors.torch import load_file

    args = ["--out", str(tmp_path / "phase2"), "--steps", "1", "--batch-size", "2", "--lr", "0", "--warmup", "1",
            "--threads", "1", "--init-from", str(smoke_dir)]
    for name, value in SMOKE_SHAPE.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    assert recipe.main(args) == 0
    before, after = load_file(smoke_dir / "model.safetensors"), load_file(tmp_path / "phase2" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)  # lr 0
    assert json.loads((tmp_path / "phase2" / "training_run.json").read_text())["init_from"] == str(smoke_dir)


def test_a_second_phase_refuses_another_seeds_run(smoke_dir, tmp_path):
    args = ["--out", str(tmp_path / "phase2"), "--seed", "1", "--steps", "1", "--init-from", str(smoke_dir)]
    for name, value in SMOKE_SHAPE.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    with pytest.raises(SystemExit, match="tokenizer is not this seed's"):
        recipe.main(args)


@pytest.fixture(scope="module")
def spread_dir(smoke_dir, tmp_path_factory):
    """The smoke run's directory with its weights spread, so that greedy output varies."""
    import shutil

    from transformers import Qwen2VLForConditionalGeneration

    spread = tmp_path_factory.mktemp("spread") / "model"
    shutil.copytree(smoke_dir, spread)
    model = Qwen2VLForConditionalGeneration.from_pretrained(smoke_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(spread)
    return spread


def test_rill_runs_the_recipe_model_as_transformers_does(spread_dir):
    """rill's Qwen2-VL runtime on the recipe's directory: greedy equal to transformers' generate for a
    picture and for a clip (rill's processors read the saved configs)."""
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from rill.multimodal.qwen2_vl_inputs import VideoClip
    from rill.sampling_params import SamplingParams

    spread = spread_dir
    hf = evaluate.TransformersBackend(spread)
    core = EngineCore(EngineConfig(model=str(spread)))
    for e in (tasks.eval_examples(0, "colour", 1)[0], tasks.eval_examples(0, "flashes", 1)[0]):
        ids, extra = hf.inputs(e)
        kind, media = ("video", VideoClip(e.frames)) if e.frames is not None else ("image", e.image)
        prompt = core.tokenizer.encode(dataset.prompt_text(e), add_special_tokens=False)
        rill_ids, items = core.mm_inputs.expand(prompt, [core.mm_inputs.item(kind, media)])
        assert rill_ids == ids
        core.add_request("r", rill_ids, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), items)
        ours = []
        while core.has_work:
            for delta in core.step():
                ours += delta.token_ids
        ids_t = torch.tensor([ids])
        types = (ids_t == 5).long() + 2 * (ids_t == 6).long()
        out = hf.model.generate(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), mm_token_type_ids=types,
                                **extra, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert ours == out[0, len(ids):].tolist() and len(set(ours)) > 1


def test_eval_reports_every_family(smoke_dir, tmp_path, capsys):
    report = tmp_path / "eval.json"
    code = evaluate.main(["--model", str(smoke_dir), "--per-family", "2", "--json", str(report)])
    table = json.loads(report.read_text())["table"]
    assert set(table) == set(tasks.FAMILIES) and all(row["total"] == 2 for row in table.values())
    assert code == (0 if all(row["accuracy"] >= evaluate.BAR for row in table.values()) else 1)
    assert "| family | question | correct | accuracy |" in capsys.readouterr().out


needs_assets = pytest.mark.skipif(not (ASSETS / "model.safetensors").is_file(), reason="rill-tiny-vision not shipped")


@needs_assets
def test_shipped_model_is_small_and_loads_in_transformers():
    from transformers import Qwen2VLForConditionalGeneration

    assert sum(p.stat().st_size for p in ASSETS.iterdir()) < 16 << 20
    assert Qwen2VLForConditionalGeneration.from_pretrained(ASSETS).config.model_type == "qwen2_vl"


@needs_assets
def test_shipped_model_names_the_colour_of_a_drawn_circle_through_rill():
    from PIL import Image, ImageDraw

    from rill.offline import LLM
    from rill.sampling_params import SamplingParams

    llm = LLM(model=str(ASSETS))
    answers = {}
    for colour, rgb in (("red", (220, 30, 30)), ("blue", (30, 70, 225)), ("green", (30, 160, 40))):
        image = Image.new("RGB", (200, 150), "white")
        ImageDraw.Draw(image).ellipse((60, 35, 140, 115), fill=rgb)
        messages = [{"role": "user", "content": [{"type": "image_pil", "image_pil": image},
                                                 {"type": "text", "text": "What colour is the circle?"}]}]
        answers[colour] = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5))[0].outputs[0].text.strip()
    assert answers == {"red": "red", "blue": "blue", "green": "green"}


@pytest.mark.slow
@needs_assets
@pytest.mark.parametrize("backend", ["transformers", "rill"])
def test_shipped_model_meets_the_bar_on_every_held_out_family(backend):
    runner = evaluate.TransformersBackend(ASSETS) if backend == "transformers" else evaluate.RillBackend(ASSETS)
    table = evaluate.evaluate(runner, 0, 100)
    assert all(row["accuracy"] >= evaluate.BAR for row in table.values()), table


def test_eval_through_rill_gives_transformers_answers(spread_dir):
    examples = [e for family in tasks.FAMILIES for e in tasks.eval_examples(0, family, 2)]
    ours = evaluate.RillBackend(spread_dir).answer(examples)
    assert ours == evaluate.TransformersBackend(spread_dir).answer(examples) and len(set(ours)) > 1
