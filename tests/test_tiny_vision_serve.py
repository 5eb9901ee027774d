"""rill-tiny-vision behind a real hypercorn server on 127.0.0.1, driven by the openai SDK: a red circle
drawn here, sent as a PNG data: URL, is answered "red"; a short MP4 of a moving circle encoded here with
PyAV, sent as a video_url, is answered with its colour too; nothing is left held after."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import openai
import pytest
from PIL import Image, ImageDraw

from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.tiny_vision.evaluate import DEFAULT_MODEL_DIR as MODEL

pytestmark = pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(), reason="rill-tiny-vision not shipped")
COLOURS = {"red": (220, 30, 30), "blue": (30, 70, 225)}


def circle_png(rgb, size=(240, 180)) -> str:
    image = Image.new("RGB", size, "white")
    w, h = size
    ImageDraw.Draw(image).ellipse((w // 2 - 50, h // 2 - 50, w // 2 + 50, h // 2 + 50), fill=rgb)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def circle_mp4(rgb, num_frames: int = 8, size: int = 128) -> str:
    """A circle drifting right on white, H.264 in MP4 at 4 fps (2 s)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=4)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(num_frames):
            image = Image.new("RGB", (size, size), "white")
            x = 30 + 6 * i
            ImageDraw.Draw(image).ellipse((x, 34, x + 60, 94), fill=rgb)
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.asarray(image), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode()


def ask(part: dict) -> list[dict]:
    return [{"role": "user", "content": [part, {"type": "text", "text": "What colour is the circle?"}]}]


async def test_sdk_picture_and_mp4_are_answered_with_the_circles_colour():
    async with running_server(MODEL) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        answers = {}
        for name, rgb in COLOURS.items():
            for kind, part in (("image", {"type": "image_url", "image_url": {"url": circle_png(rgb)}}),
                               ("video", {"type": "video_url", "video_url": {"url": circle_mp4(rgb)}})):
                reply = await client.chat.completions.create(model=str(MODEL), messages=ask(part), temperature=0,
                                                             max_tokens=5)
                answers[name, kind] = reply.choices[0].message.content.strip()
        await client.close()
        assert server.all_kv_free and server.engine.core.scheduler.vision.cache.num_holders == 0
    assert answers == {key: key[0] for key in answers}
