"""Media the tests make: encoded pictures (Pillow) and videos (PyAV), and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import http.server
import io
import struct
import threading
import zlib
from contextlib import contextmanager

import av
import numpy as np
from PIL import Image


def encode_image(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def red_circle(size: int = 64, fmt: str = "PNG") -> bytes:
    """A red circle on white (the issue's test picture)."""
    from PIL import ImageDraw

    image = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(image).ellipse((size // 4, size // 4, 3 * size // 4, 3 * size // 4), fill=(220, 30, 30))
    return encode_image(image, fmt)


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_bomb(width: int, height: int) -> bytes:
    """A valid 1-bit greyscale PNG of width x height zero pixels, written chunk by chunk: a few hundred
    kilobytes that decode to width * height pixels (a "zip bomb")."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def make_video(levels: list[int], *, fmt: str = "mp4", codec: str = "libx264", rate: int = 10,
               size: tuple[int, int] = (64, 48)) -> bytes:
    """One frame per entry of `levels`, each a flat grey of that level (0-255), so a decoded frame
    says which one it is."""
    width, height = size
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for level in levels:
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), level, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def video_without_frames() -> bytes:
    """An AVI with a video stream and no frame in it."""
    buffer = io.BytesIO()
    container = av.open(buffer, "w", format="avi")
    stream = container.add_stream("mpeg4", rate=10)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    container.start_encoding()  # writes the header with the stream in it
    container.close()
    return buffer.getvalue()


def audio_only() -> bytes:
    """An MP4 holding one AAC audio stream and no video."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    return buffer.getvalue()


class Routes(http.server.BaseHTTPRequestHandler):
    """GET paths the tests register: (status, headers, body) or a callable(handler) that answers itself."""

    routes: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        route = self.routes.get(self.path)
        if route is None:
            self.send_error(404)
        elif callable(route):
            route(self)
        else:
            status, headers, body = route
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def media_server(routes: dict):
    """A threaded HTTP server on 127.0.0.1 at an ephemeral port; yields its base URL."""
    handler = type("Handler", (Routes,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
