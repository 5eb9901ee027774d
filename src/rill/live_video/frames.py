"""One camera frame in: base64 JPEG/PNG/WebP (or a `data:image/...;base64,` URL) -> RGB pixels.

Frames are decoded by rill.media (Pillow; EXIF orientation applied, transparency on white), with the
video frame size limit (4K UHD by default): a live frame is a video frame. Blocking: decode off the
trio thread. A frame that cannot be used raises ImageError (400, code `invalid_image`) naming `param`.
"""

from __future__ import annotations

import base64
import binascii

import msgspec
import numpy as np

from rill.errors import ValidationError
from rill.media.errors import ImageError
from rill.media.image import decode_image
from rill.media.policy import MediaPolicy
from rill.media.sources import read_data_url


class Frame(msgspec.Struct, frozen=True):
    """A decoded frame and the client's timestamp for it (seconds; None when it gave none)."""

    pixels: np.ndarray  # [H, W, 3] uint8 RGB
    timestamp_s: float | None = None


class RawFrame(msgspec.Struct, frozen=True):
    """A frame as it came (decoded by the feed, only if it is not dropped first); `tag` names it in errors."""

    payload: str  # base64 or a data:image URL
    timestamp_s: float | None = None
    tag: str | None = None  # e.g. the realtime event id


def frame_bytes(payload: str, policy: MediaPolicy, param: str) -> bytes:
    """The encoded image inside a frame's payload (base64, or a data: URL)."""
    if payload.startswith("data:"):
        return read_data_url(payload, policy, kind="image", param=param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("a frame's payload must be base64 (JPEG, PNG or WebP) or a data:image URL", param) from None
    if len(data) > policy.max_media_bytes:
        raise ImageError(f"the frame has {len(data)} bytes, past the limit of {policy.max_media_bytes}", param)
    return data


def decode_frame(payload: str, policy: MediaPolicy, param: str, timestamp_s: float | None = None) -> Frame:
    image = decode_image(frame_bytes(payload, policy, param), policy, param=param)
    width, height = image.size
    if width * height > policy.max_video_frame_pixels:
        raise ImageError(f"the frame is {width}x{height} = {width * height} pixels, past the video frame limit of "
                         f"{policy.max_video_frame_pixels}", param)
    return Frame(np.asarray(image), timestamp_s)


def check_timestamp(timestamp_s: float | None, last_s: float | None, param: str) -> None:
    """Timestamps may repeat but never go back (frames are the camera's, in order)."""
    if timestamp_s is None or last_s is None:
        return
    if timestamp_s < last_s:
        raise ValidationError(f"the frame's timestamp ({timestamp_s * 1000:g} ms) is before the previous frame's "
                              f"({last_s * 1000:g} ms)", param, "invalid_timestamp")
