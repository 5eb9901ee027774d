"""/v1/models cards say what each model reads (`input_modalities`, rill's field): the web page shows its
camera button only for a card that lists "video". Real servers on 127.0.0.1 with random-weight models."""

from __future__ import annotations

import httpx

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from helpers_vision import make_vl_model_dir
from helpers_whisper import make_whisper_dir
from rill.transports.http import ServerConfig
from test_llava import make_llava_dir
from test_transcriptions_api import speech_server


async def cards(url: str, *names: str) -> tuple[list[dict], list[dict]]:
    """The list, and each named card as GET /v1/models/{name} gives it."""
    async with httpx.AsyncClient(base_url=url) as client:
        listed = (await client.get("/v1/models")).json()["data"]
        one = [(await client.get(f"/v1/models/{name}")).json() for name in names]
    return listed, one


async def test_a_qwen2_vl_card_reads_text_images_and_video_under_every_served_name(tmp_path):
    model_dir = make_vl_model_dir(tmp_path / "qwen2_vl", "qwen2_vl")
    async with running_server(model_dir, ServerConfig(served_model_names=["vl", "vl-alias"])) as server:
        listed, one = await cards(server.url, "vl", "vl-alias")
    assert [card["input_modalities"] for card in listed] == [["text", "image", "video"]] * 2
    assert one == listed


async def test_a_llava_card_reads_images_but_not_video(tmp_path):
    model_dir = make_llava_dir(tmp_path / "llava", "clip_llama")
    async with running_server(model_dir, ServerConfig(served_model_names=["llava"])) as server:
        listed, one = await cards(server.url, "llava")
    assert [card["input_modalities"] for card in listed] == [["text", "image"]]
    assert one == listed


async def test_a_text_model_reads_text_and_the_speech_model_audio(tmp_path):
    llm_dir = make_model_dir(tmp_path / "qwen2", "qwen2")
    speech_dir = make_whisper_dir(tmp_path / "whisper", multilingual=False, max_source_positions=100,
                                  max_target_positions=48)
    async with speech_server(llm_dir, speech_dir, model_name="whisper-test") as server:
        listed, one = await cards(server.url, "whisper-test")
    assert [(card["task"], card["input_modalities"]) for card in listed] == [
        ("generate", ["text"]), ("transcription", ["audio"])]
    assert one == listed[1:]
