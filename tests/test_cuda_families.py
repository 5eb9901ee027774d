"""The model families never run on a GPU, on one (issue 55, item 3): Phi-3 (with LongRoPE), Mixtral, Qwen3-MoE,
Whisper, the vision towers (Qwen2-VL, LLaVA), Kokoro, Voxtral Realtime and Kyutai STT. Each is a random small
model made by its own parity test's helpers, run by rill on the device against the family's oracle.

Skipped without CUDA (benchmarks/gpu-run.sh 13 runs it on one); `RILL_TEST_DEVICE=cpu` runs the same checks on
the CPU, which is how the harness itself is checked. The oracles: transformers (the kokoro package's KModel for
Kokoro) in float32. Text models compare on the device itself, as tests/test_cuda.py does: float32 within 1e-3
relative (‖ours - ref‖ / ‖ref‖), bfloat16 at most 1.5x transformers' own bfloat16 error + 2e-3 (the dense
Phi-3 only: a half-precision MoE can route a near tie differently, test_moe.py's prefix rule), and the engine's
greedy tokens equal to generate's. The speech and vision families run through helpers that drive transformers on
the CPU: rill on the device must give generate's tokens, and logits within the CPU parity tests' bounds.
The errors are appended as JSON lines to $RILL_GPU_REPORT when it is set.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
import torch

from helpers_families import make_family_dir
from helpers_models import engine_greedy, hf_forward, hf_greedy, hf_model, rill_forward

DEVICE = os.environ.get("RILL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="needs a CUDA GPU (or RILL_TEST_DEVICE=cpu)")

TEXT_KINDS = ["phi3", "phi3-longrope", "mixtral", "qwen3-moe", "qwen3-moe-window"]
IDS = list(range(3, 100))  # 97 tokens: past the 24-token windows and LongRoPE's original 32
PROMPTS = [list(range(200, 207)), list(range(3, 61))]


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float().cpu() - ref.float().cpu()).norm() / ref.float().cpu().norm())


def report(row: dict) -> None:
    path = os.environ.get("RILL_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": "families", "device": DEVICE, **row}) + "\n")


@pytest.fixture(scope="module", params=TEXT_KINDS)
def text_dir(request, tmp_path_factory):
    return request.param, make_family_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_text_family_logits_on_the_device_match_transformers(text_dir):
    from rill.models.loader import load

    kind, d = text_dir
    ref = hf_forward(hf_model(d).to(DEVICE), IDS)
    row = {"family": kind, "float32": relative_error(rill_forward(load(d, device=DEVICE)[3], IDS), ref)}
    if not kind.startswith(("mixtral", "qwen3-moe")):
        ours = rill_forward(load(d, dtype="bfloat16", device=DEVICE)[3], IDS)
        theirs = hf_forward(hf_model(d, torch.bfloat16).to(DEVICE), IDS)
        row["bfloat16"] = {"rill": relative_error(ours, ref), "transformers": relative_error(theirs, ref)}
    report(row)
    assert row["float32"] < 1e-3, row
    if "bfloat16" in row:
        assert row["bfloat16"]["rill"] <= 1.5 * row["bfloat16"]["transformers"] + 2e-3, row


def test_text_family_engine_greedy_on_the_device_equals_generate(text_dir):
    from rill import LLM, SamplingParams

    _, d = text_dir
    outs = LLM(str(d), num_kv_blocks=64, device=DEVICE).generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(d, out.prompt_token_ids, 16)


def test_whisper_on_the_device_decodes_as_generate(tmp_path):
    from helpers_whisper import hf_features, hf_generate, make_whisper_dir, synthetic_audio
    from rill.speech.decoding import TranscribeParams, decode_window, decoder_prompt
    from rill.speech.whisper import load_whisper

    d = make_whisper_dir(tmp_path, multilingual=True, num_mel_bins=80, max_source_positions=100, eos_like=166)
    runtime = load_whisper(d, device=DEVICE)
    for seconds in (0.6, 1.4):
        features = hf_features(d, synthetic_audio(seconds, seed=int(seconds * 10)))
        out, language = decode_window(runtime, features, TranscribeParams(), [])
        ours = decoder_prompt(runtime, language, "transcribe", []) + out
        assert ours == hf_generate(d, features, language=None, task="transcribe"), seconds


def _image_prompt(core, image, question: str):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    ids = core.tokenizer.encode(core.tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                                add_special_tokens=False)
    return core.mm_inputs.expand(ids, [core.mm_inputs.item("image", image)])


def test_qwen2_vl_tower_and_decoder_on_the_device_equal_generate(tmp_path):
    from helpers_vision import circle_image, hf_inputs, hf_vl_model, make_vl_model_dir
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore

    d = make_vl_model_dir(tmp_path, "qwen2_vl")
    core = EngineCore(EngineConfig(model=str(d), max_num_seqs=4, device=DEVICE))
    ids, items = _image_prompt(core, circle_image("red"), "What colour is the circle?")
    ours = engine_greedy(core, ids, items, 12)
    vision = core.mm_inputs.vision
    inputs = hf_inputs(ids, items, vision.image_token_id, vision.video_token_id)
    assert ours == hf_vl_model(d).generate(**inputs, max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert core.block_manager.num_used_blocks == 0


def test_llava_tower_and_decoder_on_the_device_equal_generate(tmp_path, monkeypatch):
    import transformers
    from transformers import LlavaForConditionalGeneration

    from helpers_vision import circle_image
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from test_llava import make_llava_dir

    # test_llava's decoders have head_dim 12 (hidden 48 over 4 heads); the Triton kernels take powers of two
    # from 16 (under TRITON_INTERPRET=1 on the CPU too): the same shape with heads of 16
    monkeypatch.setattr("transformers.LlamaConfig", functools.partial(transformers.LlamaConfig, head_dim=16))
    d = make_llava_dir(tmp_path, "clip_llama")
    core = EngineCore(EngineConfig(model=str(d), max_num_seqs=4, device=DEVICE))
    ids, items = _image_prompt(core, circle_image("red", (70, 50)), "What colour is it?")
    ours = engine_greedy(core, ids, items, 10)
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        theirs = LlavaForConditionalGeneration.from_pretrained(d).eval().generate(
            input_ids=ids_t, attention_mask=torch.ones_like(ids_t), pixel_values=torch.cat([it.pixels for it in items]),
            max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert ours == theirs[0, len(ids):].tolist()


def test_kokoro_on_the_device_sounds_as_kmodel(tmp_path):
    from rill.tts.kokoro import load_kokoro_backend, make_random_kokoro_dir
    from rill.tts.kokoro.vocab import to_ids

    phonemes, seed, voice = "hˈɛloʊ, wˈɜːld.", 7, "af_alloy"
    d = make_random_kokoro_dir(tmp_path / "small", shape="small", seed=1, safetensors=True)
    backend = load_kokoro_backend(d, device=DEVICE)
    style = backend.style(phonemes, voice)
    with torch.inference_mode():
        ours = backend.model.synthesize([to_ids(phonemes, backend.model.config.vocab)], style, [1.0], [seed])[0]
    try:  # the kokoro package (extra tts-ref); where it is missing, rill's own CPU run, which equals it there
        from kokoro.model import KModel

        ref_model = KModel(repo_id="hexgrad/Kokoro-82M", config=str(d / "config.json"),
                           model=str(d / "kokoro-v1_0.pth")).eval()
        torch.manual_seed(seed)  # KModel's harmonic source draws from the global generator
        reference, oracle = ref_model(phonemes, style.cpu(), 1.0), "kmodel"
    except ImportError:
        cpu = load_kokoro_backend(d, device="cpu")
        with torch.inference_mode():
            reference = cpu.model.synthesize([to_ids(phonemes, cpu.model.config.vocab)], style.cpu(), [1.0], [seed])[0]
        oracle = "rill-cpu"
    ours, reference = np.asarray(ours.cpu(), np.float32), np.asarray(reference, np.float32)
    assert ours.shape == reference.shape and np.abs(reference).max() > 0.01
    error = float(np.linalg.norm(ours - reference) / np.linalg.norm(reference))
    report({"family": "kokoro", "oracle": oracle, "float32": error})
    assert error < 1e-3


def _stream_tokens(stream, audio) -> list[int]:
    tokens = stream.feed(audio).token_ids
    return tokens + stream.finish().token_ids


def _worst(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    assert len(ours) == len(theirs)
    return max((a.float().cpu() - b.float().cpu()).abs().max().item() for a, b in zip(ours, theirs))


def test_voxtral_realtime_on_the_device_equals_generate(tmp_path):
    from helpers_voxtral import hf_transcribe, make_voxtral_dir, synthetic_audio
    from rill.speech.voxtral_realtime import VoxtralStream, load_voxtral_realtime

    d = make_voxtral_dir(tmp_path / "small", "small")
    audio = synthetic_audio(2.0, seed=1)
    ref_tokens, ref_logits, prompt = hf_transcribe(d, audio)
    stream = VoxtralStream(load_voxtral_realtime(d, device=DEVICE), None, keep_logits=True)
    tokens = _stream_tokens(stream, audio)
    assert stream.prompt == prompt and tokens == ref_tokens and len(set(ref_tokens)) >= 8
    worst = _worst(stream.logits, ref_logits)
    report({"family": "voxtral-realtime", "max_abs_logit": worst})
    assert worst < 1e-3


def test_kyutai_stt_on_the_device_equals_generate(tmp_path):
    from helpers_kyutai import hf_transcribe, make_kyutai_dir, synthetic_audio
    from rill.speech.kyutai import KyutaiStream, load_kyutai

    d = make_kyutai_dir(tmp_path / "small", "small")
    audio = synthetic_audio(3.0, seed=1)
    ref_tokens, ref_logits = hf_transcribe(d, audio)
    stream = KyutaiStream(load_kyutai(d, device=DEVICE), None, keep_logits=True)
    assert _stream_tokens(stream, audio) == ref_tokens and len(set(ref_tokens)) >= 8
    worst = _worst(stream.logits, ref_logits)
    report({"family": "kyutai-stt", "max_abs_logit": worst})
    assert worst < 1e-3
