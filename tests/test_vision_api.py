"""Images and video through the OpenAI API: a real hypercorn server on 127.0.0.1 in front of the real
engine on a random-weight Qwen2-VL model, driven by the openai SDK and httpx: image_url and video_url
parts (data: URLs made here, an MP4 encoded with PyAV), several images in several messages, the
prefix cache's hit in usage, --limit-mm-per-prompt at and past its limit, bad media, /tokenize, and the
offline API (LLM.chat, LLM.generate with multi_modal_data) answering as the server does."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import torch
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from helpers_vision import circle_image, make_vl_model_dir, noise_image
from rill.offline import LLM
from rill.openai.chat_media import parse_limits
from rill.transports.http import ServerConfig

GREEDY = {"temperature": 0, "max_tokens": 8}
EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


def png_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def mp4_url(num_frames: int = 6, fps: int = 4) -> str:
    """A short MP4 (H.264 where the wheel's FFmpeg has it): a red square that moves right."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = 112, 64, "yuv420p"
        for i in range(num_frames):
            frame = np.full((64, 112, 3), 255, np.uint8)
            frame[20:44, 10 + 12 * i : 34 + 12 * i] = (255, 0, 0)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(image) -> dict:
    return {"type": "image_url", "image_url": {"url": png_url(image), "detail": "auto"}}


def question(*parts, text="What colour is the circle?") -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


async def test_sdk_image_answer_equals_the_offline_api_and_hits_the_prefix_cache(model_dir):
    messages = question(image_part(circle_image("red")))
    async with running_server(model_dir) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        first = await client.chat.completions.create(model=str(model_dir), messages=messages, **GREEDY,
                                                     extra_body=EXTRA)
        second = await client.chat.completions.create(model=str(model_dir), messages=messages, **GREEDY,
                                                      extra_body=EXTRA)
        await client.close()
        assert server.all_kv_free
        assert server.engine.core.scheduler.vision.cache.num_holders == 0
    llm = LLM(str(model_dir))
    offline = llm.chat(messages, _params())[0]
    image_tokens = llm.engine.mm_inputs.num_image_tokens(96, 72)
    assert first.choices[0].message.content == offline.outputs[0].text == second.choices[0].message.content
    assert first.usage.prompt_tokens == len(offline.prompt_token_ids) > image_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= image_tokens  # the image's blocks were cached


def _params():
    from rill.sampling_params import SamplingParams

    return SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


async def test_images_in_several_messages_and_a_video(model_dir):
    messages = [
        {"role": "user", "content": [image_part(noise_image(90, 60, 1)), {"type": "text", "text": "and"},
                                     image_part(noise_image(60, 90, 2))]},
        {"role": "assistant", "content": "Two."},
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": mp4_url()}},
                                     {"type": "text", "text": "Where does the square go?"}]},
    ]
    body = {"model": str(model_dir), "messages": messages, **GREEDY, **EXTRA}
    async with running_server(model_dir, ServerConfig(limit_mm_per_prompt=parse_limits("image=2,video=1"))) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            answer = await client.post("/v1/chat/completions", json=body)
            stream = await client.post("/v1/chat/completions", json={**body, "stream": True})
            tokens = await client.post("/tokenize", json={"model": str(model_dir), "messages": messages})
    assert answer.status_code == 200, answer.text
    assert stream.status_code == 200 and "data: [DONE]" in stream.text
    assert tokens.json()["count"] == answer.json()["usage"]["prompt_tokens"]
    offline = LLM(str(model_dir)).chat(messages, _params())[0]
    assert answer.json()["choices"][0]["message"]["content"] == offline.outputs[0].text


async def test_limit_mm_per_prompt_at_and_past_the_limit(model_dir):
    three = [image_part(noise_image(56, 56, i)) for i in range(3)]
    server_config = ServerConfig(limit_mm_per_prompt=parse_limits("image=2,video=0"))
    async with running_server(model_dir, server_config) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            at = await client.post("/v1/chat/completions", json={
                "model": str(model_dir), "messages": question(*three[:2]), **GREEDY})
            past = await client.post("/v1/chat/completions", json={
                "model": str(model_dir), "messages": question(*three), **GREEDY})
            across = await client.post("/v1/chat/completions", json={
                "model": str(model_dir), "messages": question(*three[:2]) + [
                    {"role": "assistant", "content": "ok"}, *question(three[2])], **GREEDY})
            video = await client.post("/v1/chat/completions", json={
                "model": str(model_dir), "messages": question({"type": "video_url", "video_url": {"url": mp4_url()}}),
                **GREEDY})
        assert server.all_kv_free
    assert at.status_code == 200, at.text
    for response, param in [(past, "messages[0].content[2].image_url"), (across, "messages[2].content[0].image_url"),
                            (video, "messages[0].content[0].video_url")]:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and "--limit-mm-per-prompt" in error["message"]


@pytest.mark.parametrize("url, code", [
    ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 20).decode(), "invalid_image"),
    ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "invalid_image"),
    ("https://example.com/cat.png", "invalid_image_url"),
])
async def test_bad_images_are_400_naming_the_part(model_dir, url, code):
    messages = question({"type": "image_url", "image_url": {"url": url}})
    async with running_server(model_dir) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            response = await client.post("/v1/chat/completions", json={"model": str(model_dir), "messages": messages,
                                                                       **GREEDY, "stream": True})
        assert server.all_kv_free
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "messages[0].content[0].image_url.url"


async def test_text_only_model_refuses_an_image_naming_the_part(tmp_path):
    model_dir = make_model_dir(tmp_path, "qwen2")
    async with running_server(model_dir) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            response = await client.post("/v1/chat/completions", json={
                "model": str(model_dir), "messages": question(image_part(circle_image())), **GREEDY})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[0].type"


def test_offline_generate_with_multi_modal_data_equals_chat(model_dir):
    llm = LLM(str(model_dir))
    image = circle_image("red")
    chat = llm.chat(question({"type": "image_pil", "image_pil": image}), _params())[0]
    text = llm.tokenizer.apply_chat_template(question({"type": "image"}), add_generation_prompt=True)
    gen = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, _params())[0]
    assert gen.outputs[0].token_ids == chat.outputs[0].token_ids
    assert gen.prompt_token_ids == chat.prompt_token_ids


def test_parse_limits():
    assert parse_limits("") == {"image": 8, "video": 1}
    assert parse_limits("image=3") == {"image": 3, "video": 1}
    assert parse_limits('{"image": 2, "video": 0}') == {"image": 2, "video": 0}
    with pytest.raises(ValueError, match="audio"):
        parse_limits("audio=1")


def test_chat_template_sees_the_parts_as_transformers_renders_them(model_dir):
    """The server renders OpenAI content parts through Qwen2-VL's template as transformers'
    apply_chat_template renders the same messages in transformers' multimodal shape ({"type": "image",
    "url": ...}, {"type": "video", "url": ...}), with add_vision_id too. (A raw `video_url` part given to
    transformers renders nothing: Qwen2-VL's template knows no such type; vLLM and rill pass it as a
    video.)"""
    from transformers import PreTrainedTokenizerFast

    from rill.openai.chat import message_dict
    from rill.openai.chat_media import MediaParts
    from rill.openai.requests import Message
    from rill.tokenizer import Tokenizer
    import msgspec

    raw = [{"role": "system", "content": "Be brief."},
           {"role": "user", "content": [{"type": "text", "text": "One:"}, image_part(noise_image(56, 56)),
                                        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]},
           {"role": "assistant", "content": "Seen."},
           {"role": "user", "content": [image_part(noise_image(56, 56)), {"type": "text", "text": "Two?"}]}]
    hf = PreTrainedTokenizerFast.from_pretrained(model_dir)
    hf_shape = [m if isinstance(m["content"], str) else {**m, "content": [_transformers_part(p) for p in m["content"]]}
                for m in raw]
    ours = Tokenizer.from_dir(model_dir)
    for kwargs in ({}, {"add_vision_id": True}):
        media = MediaParts(accepts=True, limits={"image": 8, "video": 1})
        messages = [message_dict(msgspec.convert(m, Message), i, media) for i, m in enumerate(raw)]
        text = ours.apply_chat_template(messages, add_generation_prompt=True, chat_template_kwargs=kwargs)
        assert text == hf.apply_chat_template(hf_shape, tokenize=False, add_generation_prompt=True, **kwargs)
        assert [r.kind for r in media.refs] == ["image", "video", "image"]


def _transformers_part(part: dict) -> dict:
    if part["type"] in ("image_url", "video_url"):
        return {"type": part["type"][: -len("_url")], "url": part[part["type"]]["url"]}
    return part


async def test_unknown_part_types_are_400_naming_the_part(model_dir):
    async with running_server(model_dir) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            audio = await client.post("/v1/chat/completions", json={"model": str(model_dir), **GREEDY, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_audio"}]}]})
            no_url = await client.post("/v1/chat/completions", json={"model": str(model_dir), **GREEDY, "messages": [
                {"role": "user", "content": [{"type": "image_url"}]}]})
    assert audio.status_code == 400 and audio.json()["error"]["param"] == "messages[0].content[1].type"
    assert "image_url and video_url" in audio.json()["error"]["message"]
    assert no_url.status_code == 400 and no_url.json()["error"]["param"] == "messages[0].content[0].image_url"
