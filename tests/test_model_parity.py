"""rill's decoder against transformers on random-weight models of every supported architecture.

Tolerance (documented in README): float32 logits agree within 1e-4 absolute; greedy tokens are
identical. bfloat16 logits agree within 0.25 absolute (bf16 keeps 8 bits of mantissa, so one
rounding step of a logit near 10 is 0.06; measured up to 0.16 across the architectures), float16
within 0.05 (measured up to 0.019).
"""

import pytest
import torch

from helpers_models import hf_greedy, hf_logits, make_model_dir, rill_logits
from rill import LLM, SamplingParams
from rill.models.loader import load

ARCHS = ["llama", "llama3-rope", "llama-linear-rope", "mistral", "qwen2", "qwen3"]
ARCHS += ["gemma2", "gemma3"]  # windows of 24 and 16 tokens on half their layers
PROMPTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog. " * 3,  # longer than mistral's 24-token window
    "你好，世界！今天天气很好。",
    "def add(a, b):\n    return a + b\n" * 4,
]


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request, tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_logits_match_transformers_float32(model_dir):
    ids = list(range(3, 100))
    diff = (rill_logits(model_dir, ids) - hf_logits(model_dir, ids)).abs().max().item()
    assert diff < 1e-4


def test_greedy_generation_matches_transformers_token_for_token(model_dir):
    llm = LLM(str(model_dir), num_kv_blocks=128)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(model_dir, out.prompt_token_ids, 24)


# Max abs logit difference; measured up to 0.16 (bfloat16) and 0.019 (float16) across the architectures.
HALF_TOLERANCE = {torch.bfloat16: 0.25, torch.float16: 0.05}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_precision_logits_close_to_transformers(arch, dtype, tmp_path):
    d = make_model_dir(tmp_path, arch, dtype=dtype)
    if dtype == torch.float16:  # on the CPU a float16 checkpoint runs as float32 (models/dtype_choice.py):
        assert load(d)[1].dtype == torch.float32  # exact widening, so transformers in float32 is the oracle
        ids = list(range(3, 60))
        assert (rill_logits(d, ids) - hf_logits(d, ids, dtype=torch.float32)).abs().max().item() < 1e-4
        return
    assert load(d)[1].dtype == dtype  # the checkpoint's own dtype is kept
    for ids in (list(range(3, 60)), list(range(200, 260))):
        ours = rill_logits(d, ids)
        theirs = hf_logits(d, ids, dtype=dtype)
        assert (ours.float() - theirs).abs().max().item() < HALF_TOLERANCE[dtype]


def test_sharded_checkpoint_loads_the_same_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    d = make_model_dir(tmp_path / "one", "llama")
    AutoModelForCausalLM.from_pretrained(d).save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    for f in (d / "tokenizer.json", d / "tokenizer_config.json"):
        (tmp_path / "sharded" / f.name).write_bytes(f.read_bytes())
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    ids = list(range(3, 40))
    assert torch.equal(rill_logits(d, ids), rill_logits(tmp_path / "sharded", ids))
