"""Live video test helpers: frames drawn with Pillow (a red light that flashes, digits), encoded as the
wire carries them (base64 PNG/JPEG frames, WebM blobs as MediaRecorder gives them), and the answer the
same frames and question get when sent whole (the clip as one video item) through the same engine."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
from PIL import Image, ImageDraw

from rill.multimodal.qwen2_vl_inputs import VideoClip
from rill.sampling_params import SamplingParams

GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
FLASHES_QUESTION = "How many times did the red light flash?"
LAST_DIGIT_QUESTION = "What digit was shown last?"


def light_frame(on: bool, size: tuple[int, int] = (84, 56), seed: int = 0) -> np.ndarray:
    """A red light (on) or a grey one (off) on a noisy background, RGB [H, W, 3]."""
    w, h = size
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 60, (h, w, 3), dtype=np.uint8))
    r = min(w, h) // 4
    ImageDraw.Draw(image).ellipse((w // 2 - r, h // 2 - r, w // 2 + r, h // 2 + r),
                                  fill=(230, 20, 20) if on else (70, 70, 70))
    return np.asarray(image)


def light_clip(states: list[bool], size=(84, 56)) -> list[np.ndarray]:
    return [light_frame(on, size, seed=i) for i, on in enumerate(states)]


def png_b64(frame: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def jpeg_b64(frame: np.ndarray, quality: int = 90) -> str:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=quality)
    return base64.b64encode(buf.getvalue()).decode()


def webm_blobs(frames: list[np.ndarray], fps: int = 2, blob_bytes: int = 1500) -> list[bytes]:
    """A VP8 WebM of the frames at fps, cut into blobs as a MediaRecorder's timeslices are."""
    buf = io.BytesIO()
    h, w = frames[0].shape[:2]
    with av.open(buf, "w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    data = buf.getvalue()
    return [data[i:i + blob_bytes] for i in range(0, len(data), blob_bytes)]


def whole_prompt(serving, frames: list[np.ndarray], question: str, fps: float = 2.0):
    """The chat prompt of one user message [video, question], expanded with the clip as one video item."""
    content = [{"type": "video"}, {"type": "text", "text": question}]
    text = serving.tokenizer.apply_chat_template([{"role": "user", "content": content}])
    ids = serving.tokenizer.encode(text, add_special_tokens=False)
    item = serving.mm_inputs.item("video", VideoClip(np.stack(frames), fps))
    return serving.mm_inputs.expand(ids, [item])


async def whole_answer(server, frames: list[np.ndarray], question: str, greedy: dict = GREEDY) -> str:
    """What the clip and the question sent at once answer, through the server's own engine."""
    ids, items = whole_prompt(server.serving, frames, question)
    params = SamplingParams(**greedy)
    text = ""
    async for delta in server.engine.generate(ids, params, mm_items=items):
        text += delta.text
    return text
