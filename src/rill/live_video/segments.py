"""Encoded video segments decoded as they arrive: `modality: "video"` chunks carry the bytes of a WebM
or fragmented MP4 stream, such as a browser's MediaRecorder gives every `timeslice` milliseconds.
Only a stream's first blob holds its header, so the blobs are one stream: they go into a pipe that
one worker thread demuxes and decodes with PyAV (FFmpeg) as bytes come, and frames are sampled from
it at the feed's rate by their presentation time. A blob that starts with a container header (WebM's
EBML magic, MP4's `ftyp` box) starts a new stream; the one before it ends there.

Bounded: at most `max_buffered_bytes` wait in the pipe (a client sending faster than it decodes gets
an error); frames are checked against the video frame size limit; the pixels decoded may run at most
LIVE_BURST_S seconds ahead of LIVE_PIXELS_PER_S on the wall clock (a few bytes a frame of "nothing
changed" H.264 decode to 8.3 M pixels each at 4K: 8 MiB of them would be 1.3 T pixels to decode), so a
stream is decoded about as fast as one is filmed; the decoder thread ends when the stream does, or at
once when the session closes (the pipe reads as ended).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import trio

from rill.errors import ValidationError
from rill.media.errors import VideoError
from rill.media.policy import MediaPolicy

EBML_MAGIC = b"\x1a\x45\xdf\xa3"  # WebM / Matroska
FORMATS = "matroska,webm,mov,mp4,m4a,3gp,3g2,mj2"  # streamable demuxers only (no playlists, no AVI index)
DEFAULT_MAX_BUFFERED_BYTES = 8 << 20
LIVE_PIXELS_PER_S = 1920 * 1080 * 60  # what a stream may decode a second of wall time: 1080p at 60 fps
LIVE_BURST_S = 10.0  # and this many seconds of it at once (a first blob of video recorded before)


def starts_stream(data: bytes) -> bool:
    """Whether a blob begins a container (and so a new stream)."""
    return data.startswith(EBML_MAGIC) or data[4:8] == b"ftyp"


class _Pipe:
    """Bytes from the trio side to the decoder thread; read() blocks until some come or the end."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._cv = threading.Condition()
        self.ended = False

    def feed(self, data: bytes) -> None:
        with self._cv:
            if len(self._buf) + len(data) > self.max_bytes:
                raise ValidationError(f"{len(self._buf)} bytes of video wait to be decoded (at most "
                                      f"{self.max_bytes}); send video no faster than real time", "payload",
                                      "rate_limited")
            self._buf += data
            self._cv.notify_all()

    def end(self) -> None:
        with self._cv:
            self.ended = True
            self._cv.notify_all()

    def read(self, n: int) -> bytes:
        with self._cv:
            while not self._buf and not self.ended:
                self._cv.wait()
            out = bytes(self._buf[:n])
            del self._buf[:n]
            return out

    def seekable(self) -> bool:
        return False


class SegmentDecoder:
    """One encoded stream. on_frame(pixels [H, W, 3] uint8, time_s from the stream's first frame) and
    on_error(VideoError) are called on the trio thread."""

    def __init__(self, policy: MediaPolicy, fps: float, on_frame: Callable[[np.ndarray, float], None],
                 on_error: Callable[[VideoError], None], max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES):
        self.policy, self.fps = policy, fps
        self.on_frame, self.on_error = on_frame, on_error
        self._pipe = _Pipe(max_buffered_bytes)
        self.num_decoded = 0
        self.num_decoded_pixels = 0
        self.num_sampled = 0
        self.done = False  # run() returned: every frame it will give is out

    def feed(self, data: bytes) -> None:
        self._pipe.feed(data)

    def end(self) -> None:
        """No more bytes: the thread decodes what it has and stops."""
        self._pipe.end()

    async def run(self) -> None:
        try:
            await trio.to_thread.run_sync(self._decode, trio.lowlevel.current_trio_token(), abandon_on_cancel=True)
        except VideoError as exc:
            self.on_error(exc)
        finally:
            self._pipe.end()
            self.done = True

    def _decode(self, token) -> None:
        import av  # PyAV (FFmpeg) loads with the first live video, not with the server

        try:
            with av.open(self._pipe, mode="r", format=None, container_options={"format_whitelist": FORMATS}) as c:
                if not c.streams.video:
                    raise VideoError("the video stream has no video track", "payload")
                self._frames(c, token)
        except (VideoError, trio.RunFinishedError):
            raise
        except (av.error.FFmpegError, ValueError) as exc:
            if not self._pipe.ended or self.num_decoded == 0:
                raise VideoError(f"could not decode the video stream: {exc}", "payload") from None

    def _frames(self, container, token) -> None:
        first_s = next_s = None
        step_s = 1.0 / self.fps
        started_s = time.monotonic()
        for frame in container.decode(container.streams.video[0]):
            self.num_decoded += 1
            if frame.width * frame.height > self.policy.max_video_frame_pixels:
                raise VideoError(f"the video's frames are {frame.width}x{frame.height}, past the limit of "
                                 f"{self.policy.max_video_frame_pixels} pixels", "payload")
            self._check_rate(frame.width * frame.height, time.monotonic() - started_s)
            t = frame.time if frame.time is not None else (self.num_decoded - 1) * step_s
            first_s = t if first_s is None else first_s
            t -= first_s
            if next_s is not None and t < next_s - 1e-6:
                continue  # sampled at fps: this frame is between two samples
            next_s = (next_s if next_s is not None else 0.0) + step_s
            while next_s <= t:
                next_s += step_s
            self.num_sampled += 1
            pixels = frame.to_ndarray(format="rgb24")
            trio.from_thread.run_sync(self.on_frame, pixels, t, trio_token=token)

    def _check_rate(self, num_pixels: int, elapsed_s: float) -> None:
        self.num_decoded_pixels += num_pixels
        if self.num_decoded_pixels > (elapsed_s + LIVE_BURST_S) * LIVE_PIXELS_PER_S:
            raise VideoError(f"the video stream decodes to {self.num_decoded_pixels} pixels in {elapsed_s:.1f} s, "
                             f"faster than real time (at most {LIVE_PIXELS_PER_S} a second after the first "
                             f"{LIVE_BURST_S:g} s); send video as it is filmed", "payload")
