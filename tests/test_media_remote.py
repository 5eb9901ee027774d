"""rill.media remote sources against a real HTTP server on 127.0.0.1: fetched only from allowed hosts
(redirects checked again), under a byte cap and a deadline that a slow server cannot stretch."""

from __future__ import annotations

import threading
import time

import pytest

from helpers_media import make_video, media_server, red_circle
from rill.media import MediaPolicy, MediaSourceError, load_image, load_video

PNG = red_circle(32)


def allowed(**kwargs) -> MediaPolicy:
    return MediaPolicy(allowed_media_domains=("127.0.0.1",), **kwargs)


def test_an_allowed_host_is_fetched():
    clip = make_video([0, 50, 100, 150])
    with media_server({"/circle.png": (200, {"Content-Type": "image/png"}, PNG),
                       "/clip.mp4": (200, {"Content-Type": "video/mp4"}, clip)}) as base:
        assert load_image(f"{base}/circle.png", allowed()).size == (32, 32)
        assert load_video(f"{base}/clip.mp4", allowed(), fps=10, max_frames=8).num_frames == 4


def test_a_host_not_in_the_list_is_refused():
    with media_server({"/circle.png": (200, {}, PNG)}) as base:
        url = base.replace("127.0.0.1", "localhost") + "/circle.png"
        with pytest.raises(MediaSourceError, match="'localhost' is not in the allowed media domains"):
            load_image(url, allowed())
        with pytest.raises(MediaSourceError, match="--allowed-media-domains"):
            load_image(f"{base}/circle.png", MediaPolicy())


def test_redirects_are_followed_only_to_allowed_hosts():
    with media_server({"/circle.png": (200, {}, PNG)}) as base:
        port = base.rsplit(":", 1)[1]
        routes = {"/here": (302, {"Location": f"{base}/circle.png"}, b""),
                  "/relative": (307, {"Location": "/here"}, b""),
                  "/away": (302, {"Location": f"http://localhost:{port}/circle.png"}, b""),
                  "/loop": (301, {"Location": "/loop"}, b"")}
        with media_server(routes) as redirector:
            assert load_image(f"{redirector}/here", allowed()).size == (32, 32)
            assert load_image(f"{redirector}/relative", allowed()).size == (32, 32)
            with pytest.raises(MediaSourceError, match="'localhost' is not in the allowed"):
                load_image(f"{redirector}/away", allowed())
            with pytest.raises(MediaSourceError, match="more than 5 redirects"):
                load_image(f"{redirector}/loop", allowed())
            with pytest.raises(MediaSourceError, match="more than 0 redirects"):
                load_image(f"{redirector}/here", allowed(max_redirects=0))


def test_http_errors_are_invalid_image_url():
    with media_server({}) as base:
        with pytest.raises(MediaSourceError, match="HTTP 404") as info:
            load_image(f"{base}/missing.png", allowed())
        assert info.value.code == "invalid_image_url"


def test_byte_cap_at_and_past_with_and_without_content_length():
    def chunked(handler):
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for start in range(0, len(PNG), 100):
            piece = PNG[start : start + 100]
            handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        handler.wfile.write(b"0\r\n\r\n")

    with media_server({"/sized.png": (200, {}, PNG), "/chunked.png": chunked}) as base:
        for path in ("/sized.png", "/chunked.png"):
            assert load_image(base + path, allowed(max_media_bytes=len(PNG))).size == (32, 32)
            with pytest.raises(MediaSourceError, match="larger than the limit"):
                load_image(base + path, allowed(max_media_bytes=len(PNG) - 1))


def test_a_slow_server_cannot_hold_the_fetch_past_its_deadline():
    release = threading.Event()

    def drip(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(PNG)))
        handler.end_headers()
        for byte in PNG:  # a byte every 50 ms: each read is quick, the whole is not
            if release.wait(0.05):
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()

    def silent(handler):
        release.wait(10)

    try:
        with media_server({"/drip.png": drip, "/silent.png": silent}) as base:
            for path in ("/drip.png", "/silent.png"):
                started = time.perf_counter()
                with pytest.raises(MediaSourceError, match="longer than 0.5 s"):
                    load_image(base + path, allowed(fetch_timeout_s=0.5))
                assert time.perf_counter() - started < 2.0
    finally:
        release.set()


def test_a_body_cut_short_is_refused():
    def short(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(PNG)))
        handler.end_headers()
        handler.wfile.write(PNG[:50])
        handler.close_connection = True

    with media_server({"/short.png": short}) as base:
        with pytest.raises(MediaSourceError):
            load_image(f"{base}/short.png", allowed())


def test_timer_threads_do_not_leak():
    before = threading.active_count()
    with media_server({"/circle.png": (200, {}, PNG)}) as base:
        for _ in range(5):
            load_image(f"{base}/circle.png", allowed())
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before
