"""Images in: PNG, JPEG, WebP and GIF (its first frame) decoded by Pillow to an upright RGB image.

The pixel limit is checked from the header, before any pixel is decoded, so a small file that
claims a huge canvas (a PNG "zip bomb") costs nothing. Pillow's own bomb check (its warning past
89.5 M pixels, its error past twice that) stays on behind ours. Transparent pixels are composited
onto white and EXIF orientation is applied, as transformers' `load_image` / `convert_to_rgb` do.
"""

from __future__ import annotations

import io

from PIL import Image, ImageOps

from rill.media.errors import IMAGE, ImageError
from rill.media.policy import MediaPolicy
from rill.media.sources import read_source

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
_WHITE = (255, 255, 255)


def load_image(source, policy: MediaPolicy, *, param: str | None = None) -> Image.Image:
    """Decode one image from `source` into an RGB PIL image, within `policy`.

    `source` is bytes, a "data:" URL, or (when `policy` allows them) an http(s) URL, a "file://" URL,
    an absolute path or an os.PathLike; see rill.media.sources. Blocking (decoding, and fetching
    for a remote URL): call it off the trio thread, e.g. with trio.to_thread.run_sync.

    Returns a fully loaded image of mode "RGB", EXIF orientation applied, its size at most
    `policy.max_image_pixels` pixels. Raises MediaSourceError (code `invalid_image_url`) for a
    source that cannot be read and ImageError (code `invalid_image`) for bytes that are not a usable
    image (not one of FORMATS, truncated, corrupt, too many pixels); both carry `param`.
    """
    return decode_image(read_source(source, policy, kind=IMAGE, param=param), policy, param=param)


def decode_image(data: bytes, policy: MediaPolicy, *, param: str | None = None) -> Image.Image:
    """Encoded image bytes -> RGB image (see load_image)."""
    if not data:
        raise ImageError("the image is empty", param)
    image = _open(data, param)
    try:
        check_pixels(image.size, policy, param)
        rgb = to_rgb(_load(image, param))
    except BaseException:
        image.close()
        raise
    if rgb is not image:  # close() frees the image core, so only an image that is not returned
        image.close()
    return rgb


def check_pixels(size: tuple[int, int], policy: MediaPolicy, param: str | None = None) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise ImageError(f"the image is {width}x{height} pixels; it must have at least one", param)
    if width * height > policy.max_image_pixels:
        raise ImageError(f"the image is {width}x{height} = {width * height} pixels, past the limit of "
                         f"{policy.max_image_pixels}", param)


def to_rgb(image: Image.Image) -> Image.Image:
    """Upright (EXIF orientation) RGB; transparency composited onto white."""
    image = ImageOps.exif_transpose(image)
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _open(data: bytes, param: str | None) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"the image is too large to decode: {exc}", param) from None
    except Image.UnidentifiedImageError:
        raise ImageError(f"the bytes are not an image in a format this server reads ({', '.join(FORMATS)})",
                         param) from None
    except MemoryError:
        raise
    except Exception as exc:  # Pillow's plugins raise OSError, SyntaxError, ValueError, struct.error, ...
        raise ImageError(f"could not decode the image: {exc}", param) from None


def _load(image: Image.Image, param: str | None) -> Image.Image:
    """Decode the pixels (the first frame of an animation); a truncated or corrupt stream is an error."""
    try:
        image.seek(0)
        image.load()
    except MemoryError:
        raise
    except Exception as exc:  # "image file is truncated", zlib and decoder errors, oversized text chunks
        raise ImageError(f"could not decode the image: {exc}", param) from None
    return image
