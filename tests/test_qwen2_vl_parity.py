"""Qwen2-VL and Qwen2.5-VL against transformers (the oracle) on random-weight models of several shapes:
the processor's pixel values and grids, the vision tower + M-RoPE decoder's logits, and greedy output
through rill's engine token-for-token equal to transformers' generate with one image, several images
across messages, and a video, with whole and chunked prefill."""

from __future__ import annotations

import pytest
import torch

from helpers_vision import (SHAPES, circle_image, hf_inputs, hf_vl_model, make_vl_model_dir, noise_clip,
                            noise_image)
from helpers_models import engine_greedy
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.multimodal.qwen2_vl_inputs import VideoClip

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=sorted(SHAPES))
def model_dir(request, tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp(request.param), request.param)


def _prompt(core: EngineCore, case: str):
    """(messages, media) of a test case: one image; images in two messages; a video and an image."""
    fps = 2.0
    if case == "image":
        content = [{"type": "image"}, {"type": "text", "text": "What colour is the circle?"}]
        return [{"role": "user", "content": content}], [("image", circle_image("red"))]
    if case == "images":
        return ([{"role": "user", "content": [{"type": "text", "text": "Left:"}, {"type": "image"},
                                              {"type": "text", "text": "right:"}, {"type": "image"}]},
                 {"role": "assistant", "content": "Two pictures."},
                 {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this one?"}]}],
                [("image", noise_image(90, 60, 1)), ("image", noise_image(40, 130, 2)),
                 ("image", circle_image("blue", (150, 100)))])
    content = [{"type": "video"}, {"type": "text", "text": "How many times did it flash?"}, {"type": "image"}]
    return [{"role": "user", "content": content}], [("video", VideoClip(noise_clip(5), fps)),
                                                    ("image", noise_image(56, 56, 3))]


@pytest.mark.parametrize("chunk", [2048, 16])
@pytest.mark.parametrize("case", ["image", "images", "video"])
def test_greedy_equals_transformers_generate(model_dir, case, chunk):
    core = EngineCore(EngineConfig(model=str(model_dir), max_num_batched_tokens=chunk, max_num_seqs=4))
    messages, media = _prompt(core, case)
    text = core.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = core.tokenizer.encode(text, add_special_tokens=False)
    ids, items = core.mm_inputs.expand(ids, [core.mm_inputs.item(kind, m) for kind, m in media])
    assert len(items) == len(media) and len(ids) > sum(it.num_tokens for it in items)
    ours = engine_greedy(core, ids, items, 12)
    vision = core.mm_inputs.vision
    inputs = hf_inputs(ids, items, vision.image_token_id, vision.video_token_id,
                       fps=2.0 if vision.version == 25 else None)
    theirs = hf_vl_model(model_dir).generate(**inputs, max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert ours == theirs
    assert core.block_manager.num_used_blocks == 0 and core.scheduler.vision.cache.num_holders == 0


# Half precision: the bounds of the text models' parity (README: bfloat16 0.25, float16 0.05), with room in
# bfloat16 for the vision tower's own rounding before the decoder (its embeddings differ from
# transformers' by one bfloat16 step, 0.0625 at magnitude 12); measured: bfloat16 0.13-0.25, float16 0.013-0.022.
BOUNDS = {"float32": 1e-4, "bfloat16": 0.4, "float16": 0.05}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.mark.parametrize("dtype", sorted(BOUNDS))
def test_logits_equal_transformers_forward(model_dir, dtype):
    """Every position's logits, not only the argmax, of a prompt with a video and an image."""
    core = EngineCore(EngineConfig(model=str(model_dir), dtype=dtype))
    messages, media = _prompt(core, "video")
    ids = core.tokenizer.encode(core.tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                                add_special_tokens=False)
    ids, items = core.mm_inputs.expand(ids, [core.mm_inputs.item(kind, m) for kind, m in media])
    model = core.runner.model
    embeds = model.encode(torch.cat([it.pixels for it in items]), [it.grid_thw for it in items])
    rows = torch.cat([torch.arange(it.offset, it.end) for it in items])
    ours = _forward(model, ids, _positions(core, ids, items), (rows, embeds))
    vision = core.mm_inputs.vision
    inputs = hf_inputs(ids, items, vision.image_token_id, vision.video_token_id,
                       fps=2.0 if vision.version == 25 else None)
    ran = "float32" if dtype == "float16" else dtype  # on the CPU float16 runs as float32 (models/dtype_choice.py)
    with torch.no_grad():
        theirs = hf_vl_model(model_dir, DTYPES[ran])(**inputs).logits[0].float()
    assert (ours - theirs).abs().max().item() < BOUNDS[ran]


def _positions(core, ids, items):
    from rill.multimodal.mrope import MRopeLayout

    return MRopeLayout(len(ids), items, core.mm_inputs.vision.merge_size).positions(0, len(ids))


def _forward(model, ids, positions, mm_embeds) -> torch.Tensor:
    """rill's decoder over ids as one prefill step of one sequence (paged cache, blocks of 16)."""
    from rill.models.attention import AttentionMetadata

    cfg, n = model.config, len(ids)
    num_blocks = -(-n // 16)
    shape = (num_blocks, 16, cfg.num_kv_heads, cfg.head_dim)
    kv = [(torch.zeros(shape, dtype=cfg.dtype), torch.zeros(shape, dtype=cfg.dtype)) for _ in range(cfg.num_layers)]
    meta = AttentionMetadata(torch.arange(n), torch.arange(num_blocks, dtype=torch.int32)[None],
                             torch.tensor([n], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32), n)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), positions, kv, meta, mm_embeds=mm_embeds))
