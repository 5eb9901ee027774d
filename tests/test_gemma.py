"""Gemma 2 and Gemma 3 (text) beyond the shared parity suite, which runs both through float32, bfloat16
and float16 logits and greedy decoding on the engine (test_model_parity.py): configs read as transformers
reads them, the embedding scale's rounding, Gemma 3's multimodal checkpoints, and the real chat templates.

The chat templates in tests/data are copies of the real ones:
- google-gemma-2-2b-it.jinja: llama.cpp's models/templates/google-gemma-2-2b-it.jinja (ggml-org/llama.cpp,
  read from its mirror ye-NX/llama.cpp at b354d7c9), byte for byte the GGUF template that huggingface.js
  lists for ollama's library/gemma2:2b.
- google-gemma-3-it.jinja: Google's Gemma 3 instruction template (the revision that takes a string system
  message) as huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts (fe42e680)
  lists it for library/gemma3:270m; llama.cpp's models/templates holds none for Gemma 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_models import gemma_kinds, make_model_dir, rill_logits, spread_norm_weights
from helpers_tokenizers import byte_fallback_bpe, hf_tokenizer, llama_config, save_dir
from safetensors.torch import load_file, save_file

from rill.errors import ChatTemplateError, ModelLoadError
from rill.models.config import load_model_config
from rill.models.loader import load
from rill.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"

GEMMA2_HUB = {  # the shape of google/gemma-2-2b-it's config.json: no layer_types, both activation names
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32,
    "sliding_window": 4096, "rope_theta": 10000.0, "vocab_size": 300, "torch_dtype": "bfloat16",
    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "eos_token_id": [1, 107],
}
GEMMA3_OLD = {  # transformers 4 wrote the pattern as a period and the local base as its own field
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
    "sliding_window_pattern": 3, "sliding_window": 512, "rope_theta": 500000.0, "rope_local_base_freq": 99.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "vocab_size": 300, "attn_logit_softcapping": 50.0,
}
GEMMA3_MULTIMODAL = {  # google/gemma-3-4b-it's config.json states little beyond the sizes
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "eos_token_id": [1, 106],
    "torch_dtype": "bfloat16", "vision_config": {"model_type": "siglip_vision_model"},
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
}


def _write_config(path: Path, cfg: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _theirs(path: Path):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    return getattr(cfg, "text_config", None) or cfg


@pytest.mark.parametrize("raw", [GEMMA2_HUB, GEMMA3_OLD, GEMMA3_MULTIMODAL], ids=["gemma2", "gemma3-old", "gemma3-mm"])
def test_configs_read_as_transformers_reads_them(raw, tmp_path):
    path = _write_config(tmp_path, raw)
    ours, theirs = load_model_config(path), _theirs(path)
    windows = [theirs.sliding_window if t == "sliding_attention" else None for t in theirs.layer_types]
    assert list(ours.layer_windows) == windows and None in windows and theirs.sliding_window in windows
    shape = (theirs.num_attention_heads, theirs.num_key_value_heads, theirs.head_dim, theirs.hidden_size)
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.hidden_size) == shape
    assert ours.query_pre_attn_scalar == theirs.query_pre_attn_scalar
    assert ours.final_softcap == theirs.final_logit_softcapping
    assert ours.dtype == torch.bfloat16 or "torch_dtype" not in raw
    assert set(raw.get("eos_token_id", [1])) <= set(ours.eos_token_ids)
    if raw["architectures"] == ["Gemma2ForCausalLM"]:
        assert ours.attn_softcap == theirs.attn_logit_softcapping and ours.local_rope is None
        assert ours.rope.theta == theirs.rope_parameters["rope_theta"]
        return
    # transformers' Gemma 3 attention never passes attn_logit_softcapping to its attention function
    assert ours.attn_softcap is None
    full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
    assert (ours.rope.theta, ours.rope.kind) == (full["rope_theta"], full["rope_type"])
    assert ours.rope.factor == full["factor"]
    assert (ours.local_rope.theta, ours.local_rope.kind) == (local["rope_theta"], local["rope_type"])


@pytest.mark.parametrize("change,match", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types names 3 layers, num_hidden_layers is 7"),
    ({"num_attention_heads": "four"}, "invalid Gemma3ForCausalLM config"),
])
def test_gemma_settings_rill_cannot_compute_are_refused(change, match, tmp_path):
    path = _write_config(tmp_path, {**GEMMA3_OLD, **change})
    with pytest.raises(ModelLoadError, match=match):
        load_model_config(path)


def test_embedding_scale_is_rounded_to_bfloat16_first_as_in_transformers(tmp_path):
    """sqrt(96) = 9.798 is 9.8125 in bfloat16; transformers multiplies by the rounded value."""
    from transformers import AutoModelForCausalLM

    path = make_model_dir(tmp_path, "gemma3", dtype=torch.bfloat16, hidden_size=96)
    ids = torch.arange(3, 200)
    model = load(path)[3]
    with torch.inference_mode():
        ours = model.embed(ids)
        theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).model.embed_tokens(ids)
        unrounded = (model.embed_tokens(ids).float() * 96**0.5).to(torch.bfloat16)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, unrounded)  # the rounding shows at this size


def _multimodal_dir(path: Path) -> Path:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    text = gemma_kinds(None, None)["gemma3"][1]
    text_config = {**text, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 1024,
                   "initializer_range": 0.2, "eos_token_id": None, "bos_token_id": None, "pad_token_id": None}
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text_config, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                       initializer_range=0.2)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(cfg)
    spread_norm_weights(model)
    model.save_pretrained(path)
    return path


def _hf_multimodal_logits(path: Path, ids: list[int]) -> torch.Tensor:
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_multimodal_gemma3_checkpoint_serves_its_text_decoder(tmp_path):
    """Gemma3ForConditionalGeneration's text part, under transformers 5's tensor names and transformers 4's;
    the vision tower's tensors are left in the file unread."""
    path = _multimodal_dir(tmp_path / "mm")
    ids = list(range(3, 100))
    theirs = _hf_multimodal_logits(path, ids)
    assert (rill_logits(path, ids) - theirs).abs().max().item() < 1e-4
    tensors = load_file(path / "model.safetensors")
    assert any("vision_tower" in n for n in tensors)
    # transformers 5.24 still saves the decoder under transformers 4's names; rename it to the other layout
    saved, other = "language_model.model.", "model.language_model."
    if f"{other}embed_tokens.weight" in tensors:
        saved, other = other, saved
    assert f"{saved}embed_tokens.weight" in tensors
    renamed = {n.replace(saved, other): t for n, t in tensors.items()}
    save_file(renamed, path / "model.safetensors", metadata={"format": "pt"})
    assert (rill_logits(path, ids) - theirs).abs().max().item() < 1e-4


# Chat templates: rill's rendering (and ids) against transformers' apply_chat_template on the same directory.

GEMMA2_TEMPLATE = (DATA / "google-gemma-2-2b-it.jinja").read_text(encoding="utf-8")
GEMMA3_TEMPLATE = (DATA / "google-gemma-3-it.jinja").read_text(encoding="utf-8")
CONVERSATION = [
    {"role": "user", "content": "  What is 2 + 2?\n"},  # Gemma's templates trim each turn
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3? Answer in one word, 你好."},
]
SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma_pair(request, tmp_path_factory):
    template = GEMMA2_TEMPLATE if request.param == "gemma2" else GEMMA3_TEMPLATE
    path = save_dir(tmp_path_factory.mktemp(request.param), byte_fallback_bpe(), llama_config(),
                    chat_template=template)
    return request.param, Tokenizer.from_dir(path), hf_tokenizer(path)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma_chat_templates_render_and_encode_like_transformers(gemma_pair, add_generation_prompt):
    _, ours, hf = gemma_pair
    text = hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=add_generation_prompt) == text
    assert text.startswith("<s><start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n4")
    hf_ids = hf.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False,
                                    add_generation_prompt=add_generation_prompt)
    assert ours.encode_chat(CONVERSATION, add_generation_prompt=add_generation_prompt) == hf_ids


def test_gemma3_folds_the_system_message_into_the_first_user_turn_like_transformers(gemma_pair):
    name, ours, hf = gemma_pair
    if name != "gemma3":
        with pytest.raises(ChatTemplateError, match="System role not supported"):
            ours.apply_chat_template([SYSTEM, *CONVERSATION])
        return
    for system in (SYSTEM, {"role": "system", "content": [{"type": "text", "text": "You are terse."}]}):
        text = hf.apply_chat_template([system, *CONVERSATION], tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template([system, *CONVERSATION]) == text
        assert "<start_of_turn>user\nYou are terse.\n\nWhat is 2 + 2?" in text


def test_gemma_roles_out_of_turn_raise_the_templates_message(gemma_pair):
    _, ours, _ = gemma_pair
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        ours.apply_chat_template([CONVERSATION[0], CONVERSATION[0]])
