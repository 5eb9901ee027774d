"""Images and videos in chat messages: OpenAI's `image_url` parts and vLLM's `video_url` parts.

`MediaParts` walks a request's messages once: each part becomes what the chat template expects
(transformers' apply_chat_template shape, as vLLM passes it: `{"type": "image"}`, `{"type": "video"}`,
`{"type": "text", "text": ...}`), and each image or video is remembered with the JSON path of its
part, so that a source that cannot be read, or one past `--limit-mm-per-prompt`, is a 400 naming
that part. A model that reads text only refuses the part, as before. `load_media` then decodes
(rill.media), processes and places them (rill.multimodal) off the trio thread, before a byte of the
response is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from rill.errors import ValidationError
from rill.media import MediaPolicy, load_image, load_video
from rill.multimodal.inputs import IMAGE, VIDEO

DEFAULT_LIMITS = {IMAGE: 8, VIDEO: 1}  # per prompt, as vLLM's --limit-mm-per-prompt
VIDEO_FPS = 2.0  # frames sampled a second (transformers' Qwen2-VL default)
VIDEO_MAX_FRAMES = 32


def parse_limits(text: str) -> dict[str, int]:
    """`image=4,video=1` (vLLM's --limit-mm-per-prompt, also as JSON {"image": 4}) -> {kind: count}."""
    import json

    text = text.strip()
    pairs = json.loads(text).items() if text.startswith("{") else (p.split("=", 1) for p in text.split(",") if p)
    limits = dict(DEFAULT_LIMITS)
    for kind, count in pairs:
        kind = kind.strip()
        if kind not in DEFAULT_LIMITS:
            raise ValueError(f"--limit-mm-per-prompt: unknown modality {kind!r} (image, video)")
        limits[kind] = int(count)
        if limits[kind] < 0:
            raise ValueError(f"--limit-mm-per-prompt: {kind} must be >= 0")
    return limits


@dataclass
class MediaRef:
    kind: str  # IMAGE or VIDEO
    url: str
    param: str  # the part's JSON path, for errors


@dataclass
class MediaParts:
    """The media of one prompt, collected while its messages become template dicts."""

    accepts: bool  # the model has a vision tower
    limits: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    refs: list[MediaRef] = field(default_factory=list)

    def part(self, part, param: str) -> dict:
        """One content part as the chat template sees it; media remembered in order."""
        if part.type == "text" and part.text is not None:
            return {"type": "text", "text": part.text}
        kind = {"image_url": IMAGE, "video_url": VIDEO}.get(part.type)
        source = part.image_url if kind == IMAGE else part.video_url if kind == VIDEO else None
        if not self.accepts:
            raise ValidationError(f"content part type {part.type!r} is not supported: this model reads text only",
                                  param=f"{param}.type", code="unsupported")
        if kind is None:
            what = ("a text part needs text" if part.type == "text"
                    else f"content part type {part.type!r} is not supported")
            raise ValidationError(f"{what} (this model reads text, image_url and video_url parts)",
                                  param=f"{param}.type", code="unsupported")
        if source is None or not source.url:
            raise ValidationError(f"a {part.type} part needs {part.type}.url", param=f"{param}.{part.type}")
        count = sum(1 for r in self.refs if r.kind == kind) + 1
        if count > self.limits[kind]:
            raise ValidationError(f"at most {self.limits[kind]} {kind}(s) may be provided in one prompt "
                                  f"(--limit-mm-per-prompt)", param=f"{param}.{part.type}", code="too_many_media")
        self.refs.append(MediaRef(kind, source.url, f"{param}.{part.type}.url"))
        return {"type": kind}


def _load_one(ref: MediaRef, policy: MediaPolicy, mm_inputs):
    if ref.kind == IMAGE:
        return mm_inputs.item(IMAGE, load_image(ref.url, policy, param=ref.param))
    video = load_video(ref.url, policy, fps=VIDEO_FPS, max_frames=VIDEO_MAX_FRAMES, param=ref.param)
    return mm_inputs.item(VIDEO, video)


def load_items(refs: list[MediaRef], policy: MediaPolicy, mm_inputs) -> list:
    """Blocking: decode and process every image and video of a prompt, in order."""
    return [_load_one(ref, policy, mm_inputs) for ref in refs]


async def load_media(prompt_ids: list[int], refs: list[MediaRef], policy: MediaPolicy, mm_inputs):
    """(prompt ids with placeholders expanded, placed items), the work done in a worker thread."""
    def work():
        return mm_inputs.expand(prompt_ids, load_items(refs, policy, mm_inputs))

    return await trio.to_thread.run_sync(work)
