"""Images and videos for the offline API (rill.offline.LLM), in vLLM's shapes.

`LLM.generate` takes a prompt dict `{"prompt": text or "prompt_token_ids": ids, "multi_modal_data":
{"image": image or [images], "video": clip or [clips]}}` whose text already holds the placeholders
(`<|vision_start|><|image_pad|><|vision_end|>` for Qwen2-VL). `LLM.chat` takes OpenAI's content
parts (`image_url`, `video_url`, with data: URLs, or what the policy allows) and vLLM's `image_pil`;
the chat template places the placeholders as in the HTTP server.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from rill.errors import ValidationError
from rill.media import MediaPolicy, VideoFrames, load_image, load_video
from rill.multimodal.inputs import IMAGE, VIDEO
from rill.multimodal.qwen2_vl_inputs import VideoClip

VIDEO_FPS, VIDEO_MAX_FRAMES = 2.0, 32


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _video(value):
    """A clip: VideoFrames (rill.media), VideoClip, a uint8 array [T, H, W, 3], or a list of images."""
    if isinstance(value, (VideoFrames, VideoClip)):
        return value
    if isinstance(value, np.ndarray):
        return VideoClip(value, VIDEO_FPS)
    return VideoClip(list(value), VIDEO_FPS)


def prompt_items(engine, prompt_ids: list[int], multi_modal_data: dict | None):
    """(expanded ids, placed items) of one generate() prompt."""
    if not multi_modal_data:
        return prompt_ids, ()
    if engine.mm_inputs is None:
        raise ValidationError("this model reads text only: multi_modal_data is not supported",
                              param="multi_modal_data", code="unsupported")
    unknown = set(multi_modal_data) - {IMAGE, VIDEO}
    if unknown:
        raise ValidationError(f"multi_modal_data: unknown modalities {sorted(unknown)} (image, video)",
                              param="multi_modal_data")
    items = [engine.mm_inputs.item(IMAGE, im) for im in _as_list(multi_modal_data.get(IMAGE, []))]
    items += [engine.mm_inputs.item(VIDEO, _video(v)) for v in _as_list_of_clips(multi_modal_data.get(VIDEO))]
    ids, placed = engine.mm_inputs.expand(prompt_ids, items)
    return ids, tuple(placed)


def _as_list_of_clips(value) -> list:
    if value is None:
        return []
    if isinstance(value, (VideoFrames, VideoClip, np.ndarray)):
        return [value]
    if isinstance(value, list) and value and isinstance(value[0], Image.Image):
        return [value]  # one clip given as its frames
    return list(value)


def chat_messages(engine, conversation: list[dict], policy: MediaPolicy) -> tuple[list[dict], dict]:
    """(messages as the template sees them, multi_modal_data) of one chat() conversation."""
    media = {IMAGE: [], VIDEO: []}
    out = []
    for i, message in enumerate(conversation):
        content = message.get("content")
        if isinstance(content, list):
            content = [_part(engine, part, media, policy, f"messages[{i}].content[{j}]")
                       for j, part in enumerate(content)]
        out.append({**message, "content": content})
    return out, {k: v for k, v in media.items() if v}


def _part(engine, part: dict, media: dict, policy: MediaPolicy, param: str) -> dict:
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part.get("text", "")}
    if engine.mm_inputs is None:
        raise ValidationError(f"content part type {kind!r} is not supported: this model reads text only",
                              param=f"{param}.type", code="unsupported")
    if kind == "image_pil":
        media[IMAGE].append(part["image_pil"])
        return {"type": IMAGE}
    if kind == "image_url":
        media[IMAGE].append(load_image(_url(part, kind), policy, param=f"{param}.image_url.url"))
        return {"type": IMAGE}
    if kind == "video_url":
        media[VIDEO].append(load_video(_url(part, kind), policy, fps=VIDEO_FPS, max_frames=VIDEO_MAX_FRAMES,
                                       param=f"{param}.video_url.url"))
        return {"type": VIDEO}
    raise ValidationError(f"content part type {kind!r} is not supported", param=f"{param}.type", code="unsupported")


def _url(part: dict, kind: str) -> str:
    source = part.get(kind)
    return source.get("url") if isinstance(source, dict) else source
