"""The errors media input raises: each is a ValidationError, so the HTTP edge answers a 400 in
OpenAI's shape (`invalid_request_error`) with the code named here and the caller's `param`.

Codes: `invalid_image` / `invalid_video` for bytes that cannot be used (undecodable, truncated,
past a size or pixel limit, no frames); `invalid_image_url` / `invalid_video_url` (OpenAI's code for
an image URL it could not use) for a source that cannot be read (a scheme or host the operator did
not allow, a path outside the allowed root, a fetch that failed, timed out or was too large, a
malformed data: URL).
"""

from __future__ import annotations

from rill.errors import ValidationError

IMAGE = "image"
VIDEO = "video"


class MediaError(ValidationError):
    """Media that cannot be used; `kind` is IMAGE or VIDEO."""

    def __init__(self, message: str, *, kind: str, code: str, param: str | None = None):
        super().__init__(message, param=param, code=code)
        self.kind = kind


class ImageError(MediaError):
    """Image bytes that cannot be used (code `invalid_image`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, kind=IMAGE, code="invalid_image", param=param)


class VideoError(MediaError):
    """Video bytes that cannot be used (code `invalid_video`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, kind=VIDEO, code="invalid_video", param=param)


class MediaSourceError(MediaError):
    """A source that cannot be read (code `invalid_image_url` or `invalid_video_url`)."""

    def __init__(self, message: str, *, kind: str, param: str | None = None):
        super().__init__(message, kind=kind, code=f"invalid_{kind}_url", param=param)


def decode_error(kind: str, message: str, param: str | None = None) -> MediaError:
    """The decode error of `kind` (ImageError or VideoError)."""
    return ImageError(message, param) if kind == IMAGE else VideoError(message, param)
