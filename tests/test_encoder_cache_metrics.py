"""The encoder cache's numbers: hits and misses (once per sequence and image), entries and embeddings
kept, embeddings computed per step, in the engine's stats and on /metrics of a real server (hypercorn
on 127.0.0.1, httpx) in front of a random-weight Qwen2-VL; zeros for a text model."""

from __future__ import annotations

import base64
import io
import re

import httpx
import pytest
import torch

from helpers_models import make_model_dir
from helpers_server import running_server
from helpers_vision import circle_image, make_vl_model_dir, noise_image
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.sampling_params import SamplingParams

torch.set_num_threads(1)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


def _add(core: EngineCore, request_id: str, image, question: str = "What colour is it?") -> int:
    """Add one request with one image; the image's token count."""
    content = [{"type": "image"}, {"type": "text", "text": question}]
    text = core.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    ids, items = core.mm_inputs.expand(core.tokenizer.encode(text, add_special_tokens=False),
                                       [core.mm_inputs.item("image", image)])
    core.add_request(request_id, ids, GREEDY, items)
    return items[0].num_tokens


def _drain(core: EngineCore) -> None:
    while core.has_work:
        core.step()


def test_one_image_for_three_sequences_is_one_miss_and_two_hits(model_dir):
    core = EngineCore(EngineConfig(model=str(model_dir)))
    n = [_add(core, f"same-{i}", noise_image(90, 60, 5), f"Question {i}?") for i in range(3)][0]
    _drain(core)
    snap = core.snapshot()
    assert (snap.encoder_cache_misses, snap.encoder_cache_hits) == (1, 2)
    assert snap.encoder_cache_entries == 1 and snap.encoder_cache_tokens == n == snap.num_encoder_tokens
    m = _add(core, "other", circle_image("blue"))
    _drain(core)
    snap = core.snapshot()
    assert (snap.encoder_cache_misses, snap.encoder_cache_hits) == (2, 2)
    assert snap.encoder_cache_entries == 2 and snap.num_encoder_tokens == n + m
    assert list(core.stats.encoder_tokens) == [n, m]  # one entry per step that ran the encoder


def test_encoder_tokens_per_step_stay_within_the_budget(model_dir):
    """Three different images, a budget of one image's tokens: three steps of one image each; at the
    budget exactly (not one over) an image still runs."""
    probe = EngineCore(EngineConfig(model=str(model_dir)))
    n = probe.mm_inputs.item("image", noise_image(90, 60, 0)).num_tokens
    core = EngineCore(EngineConfig(model=str(model_dir), max_num_encoder_tokens=n))
    for i in range(3):
        assert _add(core, f"r{i}", noise_image(90, 60, i)) == n
    _drain(core)
    assert list(core.stats.encoder_tokens) == [n, n, n]
    snap = core.snapshot()
    assert (snap.encoder_cache_misses, snap.encoder_cache_hits) == (3, 0) and snap.num_encoder_tokens == 3 * n


def test_a_text_model_reports_zeros(tmp_path):
    core = EngineCore(EngineConfig(model=str(make_model_dir(tmp_path / "text"))))
    core.add_request("t", [5, 6, 7], GREEDY)
    _drain(core)
    snap = core.snapshot()
    assert (snap.encoder_cache_hits, snap.encoder_cache_misses, snap.encoder_cache_entries,
            snap.encoder_cache_tokens, snap.num_encoder_tokens) == (0, 0, 0, 0, 0)
    assert not core.stats.encoder_tokens


def _value(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} is not in /metrics"
    return float(match[1])


def _png_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def test_metrics_show_the_encoder_cache(model_dir):
    """The same picture twice, then another: 2 misses, 1 hit. Prefix caching is off, so the second
    request computes the picture's placeholders again and looks it up (with it on, its cached blocks
    would cover the picture and no lookup would happen)."""
    red, blue = _png_url(circle_image("red")), _png_url(circle_image("blue"))
    async with running_server(model_dir, enable_prefix_caching=False) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            before = (await client.get("/metrics")).text
            assert _value(before, "rill_encoder_cache_hits_total") == 0.0
            assert _value(before, "rill_encoder_tokens_per_step_count") == 0.0
            for url in (red, red, blue):
                content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Colour?"}]
                response = await client.post("/v1/chat/completions", json={
                    "model": str(model_dir), "messages": [{"role": "user", "content": content}], "max_tokens": 2})
                assert response.status_code == 200, response.text
            text = (await client.get("/metrics")).text
        n = server.engine.core.mm_inputs.item("image", circle_image("red")).num_tokens
    assert _value(text, "rill_encoder_cache_misses_total") == 2.0
    assert _value(text, "rill_encoder_cache_hits_total") == 1.0
    assert _value(text, "rill_encoder_cache_entries") == 2.0
    assert _value(text, "rill_encoder_cache_tokens") == 2.0 * n
    assert _value(text, "rill_encoder_tokens_total") == 2.0 * n
    assert _value(text, "rill_encoder_tokens_per_step_count") == 2.0
    assert _value(text, "rill_encoder_tokens_per_step_sum") == 2.0 * n
