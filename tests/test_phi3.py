"""Phi-3 against transformers on random-weight models: fused checkpoint tensors, a sliding window,
LongRoPE's short and long factors (tolerances as in test_model_parity: float32 logits within 1e-4,
bfloat16 within 0.25, float16 within 0.05, greedy tokens identical)."""

import json
import math

import pytest
import torch
from safetensors import safe_open

from helpers_families import LONGROPE, LONGROPE_ORIGINAL, make_family_dir
from helpers_models import hf_greedy, hf_logits, hf_model, rill_logits
from rill import LLM, SamplingParams
from rill.errors import ModelLoadError
from rill.models.config import load_model_config

PROMPTS = [
    "Hello world!",  # 7 tokens: with 16 new ones it stays within LongRoPE's original 32
    "The quick brown fox jumps over the lazy dog. " * 3,  # 58: past the window (24) and the original length
    "def add(a, b):\n    return a + b\n" * 4,  # 72
]


@pytest.fixture(scope="module", params=["phi3", "phi3-longrope"])
def model_dir(request, tmp_path_factory):
    return make_family_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_checkpoint_ships_fused_projections(model_dir):
    with safe_open(model_dir / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert "model.layers.0.self_attn.q_proj.weight" not in names


def test_logits_match_transformers_float32(model_dir):
    # 97 tokens: LongRoPE's long factors; 17: its short ones
    for ids in (list(range(3, 100)), list(range(200, 217))):
        assert (rill_logits(model_dir, ids) - hf_logits(model_dir, ids)).abs().max().item() < 1e-4


def test_greedy_generation_matches_transformers_token_for_token(model_dir):
    llm = LLM(str(model_dir), num_kv_blocks=64)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(model_dir, out.prompt_token_ids, 16)


def hf_greedy_step_by_step(model_dir, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' forward fed one token at a time on its own cache: no generate(), so no Phi-3
    re-prefill when the sequence passes original_max_position_embeddings."""
    from transformers import DynamicCache

    model = hf_model(model_dir)
    cache, new = DynamicCache(config=model.config), []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids]), cache=cache, use_cache=True).logits
        for _ in range(max_new_tokens):
            new.append(int(logits[0, -1].argmax()))
            logits = model(torch.tensor([new[-1:]]), cache=cache, use_cache=True).logits
    return new


def test_decoding_past_the_original_length_keeps_short_factor_keys_like_transformers_forward(tmp_path):
    d = make_family_dir(tmp_path, "phi3-longrope")
    prompt = list(range(200, 220))  # 20 tokens; the 13th new token passes 32
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    out = LLM(str(d), num_kv_blocks=64).generate(prompt, params)[0]
    assert out.outputs[0].token_ids == hf_greedy_step_by_step(d, prompt, 24)


# Max abs logit difference, as in test_model_parity (measured here: bfloat16 0.18, float16 0.022).
HALF_TOLERANCE = {torch.bfloat16: 0.25, torch.float16: 0.05}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["phi3", "phi3-longrope"])
def test_half_precision_logits_close_to_transformers(kind, dtype, tmp_path):
    d = make_family_dir(tmp_path, kind, dtype=dtype)
    for ids in (list(range(3, 60)), list(range(200, 220))):
        ours, theirs = rill_logits(d, ids), hf_logits(d, ids, dtype=dtype)
        assert (ours - theirs).abs().max().item() < HALF_TOLERANCE[dtype]


def _phi3_config(tmp_path, **changes) -> dict:
    d = tmp_path / "phi3"
    if not d.exists():
        make_family_dir(d, "phi3-longrope")
    raw = {**json.loads((d / "config.json").read_text()), **changes}
    (d / "config.json").write_text(json.dumps(raw))
    return d


def test_longrope_attention_factor_follows_the_length_ratio(tmp_path):
    rope = load_model_config(_phi3_config(tmp_path)).rope
    assert rope.kind == "longrope" and rope.original_max_position == LONGROPE_ORIGINAL
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(256 / 32) / math.log(32)))
    assert rope.short_factor == tuple(LONGROPE["short_factor"])


def test_phi3_early_rope_scaling_names_read_as_longrope(tmp_path):
    scaling = {k: v for k, v in LONGROPE.items() if k != "rope_type"} | {"type": "su", "attention_factor": 1.5}
    d = _phi3_config(tmp_path, rope_parameters=None, rope_scaling=scaling, rope_theta=10000.0)
    rope = load_model_config(d).rope
    assert (rope.kind, rope.attention_factor) == ("longrope", 1.5)


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_parameters": {**LONGROPE, "partial_rotary_factor": 0.75}}, "partial_rotary_factor"),  # Phi-4-mini
    ({"rope_parameters": {**LONGROPE, "long_factor": [1.0, 2.0]}}, "head_dim / 2 = 8"),
    ({"architectures": ["LlamaForCausalLM"]}, "Phi3ForCausalLM only"),
])
def test_unsupported_rope_configs_are_model_load_errors(tmp_path, changes, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model_config(_phi3_config(tmp_path, **changes))
