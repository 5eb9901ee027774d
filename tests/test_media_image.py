"""rill.media images and sources: every format decodes to upright RGB, every refusal is a MediaError that
the HTTP edge answers as a 400 in OpenAI's shape, and every limit holds at and past it."""

from __future__ import annotations

import os
import time

import pytest
from PIL import Image

from helpers_media import data_url, encode_image, png_bomb, red_circle
from rill.errors import ValidationError
from rill.media import ImageError, MediaError, MediaPolicy, MediaSourceError, load_image
from rill.openai.errors import from_exception

POLICY = MediaPolicy()


def solid(mode: str, colour, size=(8, 6)) -> Image.Image:
    return Image.new(mode, size, colour)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb(fmt):
    data = encode_image(solid("RGB", (200, 30, 30)), fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    image = load_image(data, POLICY)
    assert image.mode == "RGB" and image.size == (8, 6)
    r, g, b = image.getpixel((4, 3))
    assert r > 150 and g < 80 and b < 80


def test_gif_gives_its_first_frame():
    frames = [solid("RGB", (255, 0, 0)), solid("RGB", (0, 0, 255))]
    data = encode_image(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert Image.open(__import__("io").BytesIO(data)).n_frames == 2
    assert load_image(data, POLICY).getpixel((0, 0)) == (255, 0, 0)


def test_transparency_is_composited_on_white_and_grey_becomes_rgb():
    assert load_image(encode_image(solid("RGBA", (255, 0, 0, 0))), POLICY).getpixel((0, 0)) == (255, 255, 255)
    assert load_image(encode_image(solid("RGBA", (255, 0, 0, 255))), POLICY).getpixel((0, 0)) == (255, 0, 0)
    assert load_image(encode_image(solid("LA", (0, 0))), POLICY).getpixel((0, 0)) == (255, 255, 255)
    assert load_image(encode_image(solid("L", 77)), POLICY).getpixel((0, 0)) == (77, 77, 77)


def test_exif_orientation_is_applied():
    image = solid("RGB", (0, 0, 0), size=(10, 4))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    data = encode_image(image, "JPEG", exif=exif.tobytes())
    assert load_image(data, POLICY).size == (4, 10)


def test_truncated_png_is_invalid_image():
    data = red_circle(64)
    with pytest.raises(ImageError) as info:
        load_image(data[: len(data) // 2], POLICY, param="messages[0].content[0].image_url.url")
    assert info.value.code == "invalid_image" and info.value.param == "messages[0].content[0].image_url.url"


def test_non_image_bytes_and_unsupported_formats_are_invalid_image():
    for data in (b"this is not a picture", b"\x00" * 512, encode_image(solid("RGB", 0), "BMP")):
        with pytest.raises(ImageError, match="not an image in a format"):
            load_image(data, POLICY)
    with pytest.raises(ImageError, match="empty"):
        load_image(b"", POLICY)


def test_zip_bomb_png_is_refused_from_its_header():
    data = png_bomb(30_000, 30_000)  # 900 M pixels (2.7 GB as RGB) in a few hundred kB
    assert len(data) < 1_000_000
    started = time.perf_counter()
    with pytest.raises(ImageError, match="pixels") as info:
        load_image(data, POLICY)
    assert time.perf_counter() - started < 2.0  # nothing was decoded
    assert info.value.code == "invalid_image"


def test_pixel_limit_at_and_past():
    policy = MediaPolicy(max_image_pixels=64 * 64)
    assert load_image(encode_image(solid("RGB", 0, (64, 64))), policy).size == (64, 64)
    with pytest.raises(ImageError, match="past the limit of 4096"):
        load_image(encode_image(solid("RGB", 0, (64, 65))), policy)
    # a bomb that is small in pixels but past the limit is refused the same way
    with pytest.raises(ImageError, match="pixels"):
        load_image(png_bomb(65, 64), policy)
    assert load_image(png_bomb(64, 64), policy).size == (64, 64)


def test_byte_limit_at_and_past_for_bytes_and_data_urls():
    data = red_circle(32)
    at = MediaPolicy(max_media_bytes=len(data))
    assert load_image(data, at).size == (32, 32)
    assert load_image(data_url(data), at).size == (32, 32)
    past = MediaPolicy(max_media_bytes=len(data) - 1)
    for source in (data, data_url(data)):
        with pytest.raises(MediaSourceError, match="larger than the limit") as info:
            load_image(source, past)
        assert info.value.code == "invalid_image_url"


def test_data_urls():
    data = red_circle(16)
    assert load_image(data_url(data), POLICY).size == (16, 16)
    assert load_image(data_url(data, "application/octet-stream"), POLICY).size == (16, 16)  # the bytes decide
    from urllib.parse import quote_from_bytes

    assert load_image("data:image/png," + quote_from_bytes(data), POLICY).size == (16, 16)  # RFC 2397 percent form
    for bad, message in (("data:image/png;base64,@@@@", "not valid base64"), ("data:image/png;base64", "no ','"),
                         ("data:image/png;base64,", "no data")):
        with pytest.raises(MediaSourceError, match=message):
            load_image(bad, POLICY)
    with pytest.raises(ImageError):
        load_image(data_url(b"plain text, not a picture"), POLICY)


def test_remote_url_is_refused_when_remote_media_is_off():
    with pytest.raises(MediaSourceError, match="--allowed-media-domains") as info:
        load_image("https://example.com/cat.png", POLICY, param="messages[0].content[1].image_url.url")
    error = from_exception(info.value)
    assert (error.status, error.code, error.param) == (400, "invalid_image_url", "messages[0].content[1].image_url.url")
    assert error.body.error.type == "invalid_request_error"


def test_other_schemes_and_types_are_refused():
    for source in ("ftp://example.com/a.png", "cat.png", "relative/path.png", "javascript:alert(1)"):
        with pytest.raises(MediaSourceError):
            load_image(source, POLICY)
    with pytest.raises(MediaSourceError, match="URL string or bytes"):
        load_image(12345, POLICY)


# -- local files -------------------------------------------------------------------------------------------


@pytest.fixture
def media_root(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    (root / "circle.png").write_bytes(red_circle(24))
    (tmp_path / "secret.png").write_bytes(red_circle(24))
    return root


def test_local_files_are_off_by_default(media_root):
    for source in (media_root / "circle.png", str(media_root / "circle.png"), (media_root / "circle.png").as_uri()):
        with pytest.raises(MediaSourceError, match="--allowed-local-media-path"):
            load_image(source, POLICY)


def test_local_file_under_the_allowed_root(media_root):
    policy = MediaPolicy(allowed_local_media_path=str(media_root))
    for source in (media_root / "circle.png", str(media_root / "circle.png"), (media_root / "circle.png").as_uri()):
        assert load_image(source, policy).size == (24, 24)


def test_local_path_outside_the_allowed_root_is_refused(media_root):
    policy = MediaPolicy(allowed_local_media_path=str(media_root))
    outside = media_root.parent / "secret.png"
    os.symlink(outside, media_root / "link.png")
    for source in (str(outside), f"{media_root}/../secret.png", str(media_root / "link.png"), outside.as_uri(),
                   "/etc/passwd"):
        with pytest.raises(MediaSourceError, match="outside the allowed local media path"):
            load_image(source, policy)
    with pytest.raises(MediaSourceError, match="not a regular file"):
        load_image(str(media_root), policy)
    with pytest.raises(MediaSourceError, match="not a regular file"):
        load_image(str(media_root / "missing.png"), policy)
    with pytest.raises(MediaSourceError, match="local path"):
        load_image("file://otherhost/" + str(media_root / "circle.png"), policy)


def test_local_file_byte_limit_at_and_past(media_root):
    size = (media_root / "circle.png").stat().st_size
    path = str(media_root / "circle.png")
    assert load_image(path, MediaPolicy(allowed_local_media_path=str(media_root), max_media_bytes=size))
    with pytest.raises(MediaSourceError, match="larger than the limit"):
        load_image(path, MediaPolicy(allowed_local_media_path=str(media_root), max_media_bytes=size - 1))


def test_every_media_error_is_a_validation_error():
    assert issubclass(MediaError, ValidationError)
    with pytest.raises(ValueError):
        MediaPolicy(max_image_pixels=0)
    with pytest.raises(ValueError):
        MediaPolicy(fetch_timeout_s=0)


def test_serve_flags_and_environment_fill_the_policy(monkeypatch):
    from rill.cli import build_parser
    from rill.media import policy as media_policy

    args = build_parser().parse_args(["serve", "--allowed-media-domains", "127.0.0.1", "images.example.com",
                                      "--allowed-local-media-path", "/srv/media", "--media-fetch-timeout-s", "2.5",
                                      "--max-media-bytes", "1000"])
    policy = media_policy.from_args(args)
    assert policy.allowed_media_domains == ("127.0.0.1", "images.example.com")
    assert policy.allowed_local_media_path == "/srv/media"
    assert (policy.fetch_timeout_s, policy.max_media_bytes) == (2.5, 1000)
    assert policy.allows_host("IMAGES.example.com.") and not policy.allows_host("example.com")
    defaults = media_policy.from_args(build_parser().parse_args(["serve"]))
    assert defaults == MediaPolicy() and not defaults.allows_remote
    monkeypatch.setenv("RILL_ALLOWED_MEDIA_DOMAINS", "a.example, b.example")
    monkeypatch.setenv("RILL_ALLOWED_LOCAL_MEDIA_PATH", "/data")
    from_env = media_policy.from_args(build_parser().parse_args(["serve"]))
    assert from_env.allowed_media_domains == ("a.example", "b.example")
    assert from_env.allowed_local_media_path == "/data"
