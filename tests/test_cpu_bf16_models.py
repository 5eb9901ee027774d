"""bfloat16 models on rill's CPU C path (packed bfloat16 linears, decode attention over a bfloat16 cache, the
glue): logits and greedy output against transformers in bfloat16, greedy output the same alone and batched
and at any thread count, and `--dtype auto`'s choice on the CPU (float16 runs as float32), logged.

Parity: transformers and rill both round every op's result to bfloat16, but sum in other orders (their
attention is SDPA over the whole prompt, rill's decode rows read the paged cache in C), so a logit can move
by a bfloat16 step or two, and greedy output parts where transformers' own top two logits are that close.
The greedy tests hold rill to exactly that: its tokens equal transformers' up to the first near-tie, where
the token rill picked is within HALF_TOLERANCE of transformers' best (the same tolerance as the logits).
Measured with random-weight models: most prompts agree for all 24 tokens; llama3-rope, llama and qwen2
part on one prompt each, at the same positions whether rill runs its C kernels or torch's (RILL_CPU_KERNELS=0).
"""

from __future__ import annotations

import logging

import pytest
import torch

from helpers_models import hf_model, make_model_dir, rill_forward
from rill import LLM, SamplingParams
from rill.kernels import cpu_build
from rill.models.linear import pack_for_cpu
from rill.models.loader import load

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="rill's C kernels are not built here")
BF16 = torch.bfloat16
HALF_TOLERANCE = 0.25  # as test_model_parity.py's for bfloat16 logits
FAST_ARCHS = ["qwen2", "mistral"]
ALL_ARCHS = ["llama", "llama3-rope", "qwen3", "gemma2", "gemma3"]  # the rest, in the slow step
PROMPTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog. " * 3,  # past mistral's 24-token window
    "def add(a, b):\n    return a + b\n" * 4,
]
ARCH_PARAMS = [*FAST_ARCHS, *(pytest.param(a, marks=pytest.mark.slow) for a in ALL_ARCHS)]


@pytest.fixture(scope="module", params=ARCH_PARAMS)
def bf16_dir(request, tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp(request.param), request.param, dtype=BF16)


def test_packed_bf16_model_logits_close_to_transformers(bf16_dir):
    model = load(bf16_dir)[3]
    assert pack_for_cpu(model) > 0  # the C path, not torch's
    assert all(m.c_packed.dtype == BF16 for m in model.modules() if getattr(m, "c_packed", None) is not None)
    theirs_model = hf_model(bf16_dir, BF16)
    for ids in (list(range(3, 60)), list(range(200, 260))):
        ours = rill_forward(model, ids).float()
        with torch.inference_mode():
            theirs = theirs_model(torch.tensor([ids])).logits[0].float()
        assert (ours - theirs).abs().max().item() < HALF_TOLERANCE


def test_greedy_output_follows_transformers_up_to_a_bfloat16_near_tie(bf16_dir):
    llm = LLM(str(bf16_dir), num_kv_blocks=128, dtype="bfloat16")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    theirs = hf_model(bf16_dir, BF16)
    for out in outs:
        prompt, ours = out.prompt_token_ids, out.outputs[0].token_ids
        with torch.inference_mode():  # transformers' logits at every position of rill's answer
            logits = theirs(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1:-1].float()
        for i, token in enumerate(ours):
            best = int(logits[i].argmax())
            if token != best:  # rill parted from transformers: only where transformers' two are that close
                assert logits[i, best] - logits[i, token] < HALF_TOLERANCE, (out.prompt, i)
                break


def test_greedy_output_is_the_same_alone_batched_and_on_one_thread(tmp_path):
    d = make_model_dir(tmp_path, "qwen2", dtype=BF16)
    llm = LLM(str(d), num_kv_blocks=128)  # auto: the checkpoint's bfloat16
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [*PROMPTS, "one two three four five six seven eight nine ten " * 5]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert alone == batched
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == batched
    finally:
        torch.set_num_threads(before)


def test_dtype_auto_keeps_bfloat16_and_logs_the_c_path(tmp_path, caplog):
    d = make_model_dir(tmp_path, "qwen2", dtype=BF16)
    with caplog.at_level(logging.INFO, logger="rill.models"):
        cfg = load(d, "auto")[1]
    assert cfg.dtype == BF16
    assert f"dtype bfloat16 (auto) on the CPU: rill's C kernels, bfloat16 path {cpu_build.bf16_path()}" in caplog.text


@pytest.mark.parametrize("asked", [None, "auto", "float16"])
def test_float16_runs_as_float32_on_the_cpu_and_says_so(tmp_path, caplog, asked):
    d = make_model_dir(tmp_path, "qwen2", dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger="rill.models"):
        cfg, model = load(d, asked)[1::2]
    assert cfg.dtype == torch.float32 and model.lm_head.weight.dtype == torch.float32
    record = next(r for r in caplog.records if "float16 has no fast path on the CPU" in r.getMessage())
    assert record.levelno == (logging.WARNING if asked == "float16" else logging.INFO)  # asked for: a warning
    assert "dtype float32 (from float16) on the CPU: rill's C kernels, float32" in caplog.text


def test_vllm_compare_summary_judges_bfloat16_by_issue_53s_targets(tmp_path):
    import json

    from rill.bench import vllm_compare

    def result(tok_s, tpot):
        return {"output_throughput": tok_s, "median_tpot_ms": tpot, "median_ttft_ms": 500.0, "completed": 64}

    (tmp_path / "setup.json").write_text(json.dumps({"dtype": "bfloat16"}))
    # 1.4x at 8 in flight meets issue 33's float32 target (1.25x), not issue 53's bfloat16 one (1.5x)
    for name, body in {"rill-inf-1": result(200, 300), "vllm-inf-1": result(160, 270),
                       "rill-c8-1": result(140, 30), "vllm-c8-1": result(100, 50)}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    assert vllm_compare.main([str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["setup"]["dtype"] == "bfloat16" and summary["target_ratio"] == {"inf": 1.25, "c8": 1.5}
    assert summary["met"] is False
    (tmp_path / "rill-c8-1.json").write_text(json.dumps(result(160, 30)))  # 1.6x, TPOT 0.6x
    vllm_compare.main([str(tmp_path)])
    assert json.loads((tmp_path / "summary.json").read_text())["met"] is True
