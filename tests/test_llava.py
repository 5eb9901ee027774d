"""LLaVA (LlavaForConditionalGeneration) against transformers on random-weight models the tests make:
CLIP's and SigLIP's pixel values equal to transformers' image processors, tower + projector features
equal to get_image_features, and greedy output through rill's engine token-for-token equal to
transformers' generate over Llama, Mistral and Qwen2 decoders, with one image and with two."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from helpers_tokenizers import byte_level_bpe, save_dir
from helpers_vision import circle_image, noise_image
from helpers_models import engine_greedy
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.errors import ModelLoadError, ValidationError
from rill.multimodal.llava_processor import LlavaPixelConfig, process_image
from rill.sampling_params import SamplingParams

torch.set_num_threads(1)

IMAGE_TOKEN = "<image>"
TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
CLIP_PRE = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 28},
            "crop_size": {"height": 28, "width": 28}, "do_center_crop": True, "resample": 3,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
SIGLIP_PRE = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 32, "width": 32}, "resample": 3,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
# (tower, its config, preprocessor, feature layer, strategy, text model)
SHAPES = {
    "clip_llama": ("clip", dict(image_size=28, patch_size=7, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=3, num_attention_heads=4), CLIP_PRE, -2, "default", "llama"),
    "clip_qwen2_layers": ("clip", dict(image_size=28, patch_size=14, hidden_size=24, intermediate_size=40,
                                       num_hidden_layers=3, num_attention_heads=2), CLIP_PRE, [-3, -1], "full",
                          "qwen2"),
    "siglip_mistral": ("siglip", dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4), SIGLIP_PRE, -1, "full", "mistral"),
    "siglip_llama_default": ("siglip", dict(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=3, num_attention_heads=2), SIGLIP_PRE, -2, "default",
                             "llama"),
}


def make_llava_dir(path, shape: str, seed: int = 0):
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              MistralConfig, Qwen2Config, SiglipVisionConfig)

    tower, vision, pre, layer, strategy, text = SHAPES[shape]
    backend = byte_level_bpe()
    backend.add_special_tokens([IMAGE_TOKEN, "</s>"])
    save_dir(path, backend, {"bos_token": None, "eos_token": "</s>", "chat_template": TEMPLATE})
    text_cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[text]
    text_cfg = text_cls(vocab_size=backend.get_vocab_size(), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    vision_cls = CLIPVisionConfig if tower == "clip" else SiglipVisionConfig
    cfg = LlavaConfig(vision_config=vision_cls(**vision, initializer_range=0.2), text_config=text_cfg,
                      image_token_id=backend.token_to_id(IMAGE_TOKEN), vision_feature_layer=layer,
                      vision_feature_select_strategy=strategy, projector_hidden_act="gelu")
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg)
    with torch.no_grad():  # CLIP's class embedding and the towers' norms start at constants: spread them
        for name, p in model.named_parameters():
            if "vision" in name or "projector" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    return path


@pytest.fixture(scope="module", params=sorted(SHAPES))
def llava_dir(request, tmp_path_factory):
    return make_llava_dir(tmp_path_factory.mktemp(request.param), request.param)


def hf_processor(pre: dict):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    kind = CLIPImageProcessorPil if pre["image_processor_type"].startswith("CLIP") else SiglipImageProcessorPil
    return kind(**{k: v for k, v in pre.items() if k != "image_processor_type"})


IMAGES = [noise_image(64, 48, 1), noise_image(20, 90, 2), noise_image(28, 28, 3), noise_image(13, 17, 4),
          circle_image("red", (120, 80)), Image.fromarray(np.full((30, 50, 4), 128, np.uint8), "RGBA")]


CLIP_224 = {**CLIP_PRE, "size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}
SIGLIP_384 = {**SIGLIP_PRE, "size": {"height": 384, "width": 384}}


@pytest.mark.parametrize("pre", [CLIP_PRE, SIGLIP_PRE, CLIP_224, SIGLIP_384],
                         ids=["clip", "siglip", "clip224", "siglip384"])
def test_pixel_values_equal_transformers(pre):
    ours_cfg, theirs = LlavaPixelConfig.from_dict(pre), hf_processor(pre)
    for image in IMAGES:
        expected = theirs(images=[image], return_tensors="pt")["pixel_values"]
        ours = process_image(image, ours_cfg)
        assert ours.shape == expected.shape
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


def test_tower_features_equal_get_image_features(llava_dir):
    from transformers import LlavaForConditionalGeneration

    from rill.models.loader import load

    hf = LlavaForConditionalGeneration.from_pretrained(llava_dir).eval()
    _, cfg, _, ours = load(llava_dir)
    pre = json.loads((llava_dir / "preprocessor_config.json").read_text())
    pixels = torch.cat([process_image(im.convert("RGB"), LlavaPixelConfig.from_dict(pre)) for im in IMAGES[:3]])
    with torch.no_grad():
        expected = torch.cat(list(hf.get_image_features(pixel_values=pixels).pooler_output))
    got = ours.encode(pixels, [(1, 1, 1)] * 3)
    assert got.shape == (3 * cfg.vision.tokens_per_image, cfg.hidden_size) == expected.flatten(0, -2).shape
    torch.testing.assert_close(got, expected.flatten(0, -2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [2048, 8])
@pytest.mark.parametrize("case", ["one", "two"])
def test_greedy_equals_transformers_generate(llava_dir, case, chunk):
    from transformers import LlavaForConditionalGeneration

    core = EngineCore(EngineConfig(model=str(llava_dir), max_num_batched_tokens=chunk, max_num_seqs=4))
    if case == "one":
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
        images = [circle_image("red", (70, 50))]
    else:
        messages = [{"role": "user", "content": [{"type": "text", "text": "Left:"}, {"type": "image"},
                                                 {"type": "text", "text": "right:"}, {"type": "image"}]}]
        images = [noise_image(40, 60, 5), circle_image("blue", (50, 50))]
    text = core.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = core.tokenizer.encode(text, add_special_tokens=False)
    ids, items = core.mm_inputs.expand(ids, [core.mm_inputs.item("image", im) for im in images])
    placeholders = sum(t == core.mm_inputs.placeholder("image") for t in ids)
    assert placeholders == len(images) * core.model_config.vision.tokens_per_image
    ours = engine_greedy(core, ids, items, 10)
    hf = LlavaForConditionalGeneration.from_pretrained(llava_dir).eval()
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        out = hf.generate(input_ids=ids_t, attention_mask=torch.ones_like(ids_t),
                          pixel_values=torch.cat([it.pixels for it in items]), max_new_tokens=10, do_sample=False,
                          min_new_tokens=10)
    assert ours == out[0, len(ids):].tolist()
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks  # the request freed its KV


def test_llava_refuses_video_and_unsupported_towers(tmp_path):
    path = make_llava_dir(tmp_path / "m", "clip_llama")
    core = EngineCore(EngineConfig(model=str(path)))
    with pytest.raises(ValidationError, match="reads images, not videos"):
        core.mm_inputs.item("video", [noise_image(28, 28)])
    cfg = json.loads((path / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "dinov2"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="dinov2"):
        EngineCore(EngineConfig(model=str(path)))


async def test_openai_sdk_image_to_llava_equals_the_offline_api(tmp_path):
    """A LLaVA model behind `rill serve`'s app: the SDK's image_url answer equals LLM.chat's; a video part
    is a 400 naming it; KV and encoder-cache holders are free after."""
    import base64
    import io

    import openai

    from helpers_server import running_server
    from rill.offline import LLM

    path = make_llava_dir(tmp_path / "m", "clip_llama")
    buf = io.BytesIO()
    circle_image("red", (60, 40)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What colour is it?"}]}]
    video = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}]
    async with running_server(path) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        answer = await client.chat.completions.create(model=str(path), messages=messages, temperature=0, max_tokens=6,
                                                      extra_body={"ignore_eos": True})
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=str(path), messages=video, max_tokens=2)
        await client.close()
        assert server.all_kv_free and server.engine.core.scheduler.vision.cache.num_holders == 0
    assert refused.value.body["param"].startswith("messages[0].content[0]")
    offline = LLM(str(path)).chat(messages, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert answer.choices[0].message.content == offline.outputs[0].text
    assert answer.usage.prompt_tokens == len(offline.prompt_token_ids)
