"""Video in: MP4/MOV, WebM/Matroska and AVI decoded by PyAV (FFmpeg), sampled at a requested rate.

Two passes over the bytes. The first only demuxes (no decoding, cheap): it counts the video packets
and reads their timestamps, so a video of too many frames, too many pixels to decode (frames x
width x height) or too long a duration (a small file of hours of black frames) is refused before
any frame is decoded, and the duration is exact even where the header has none. The second decodes
and keeps only the sampled frames, converted to RGB.

Sampling: frame k is the frame on screen at t_k = k / fps (k = 0, 1, ... while t_k < duration), the
latest frame whose time is <= t_k. When that gives more than `max_frames` frames, `max_frames` times
spread evenly over the duration instead (t_k = k * duration / max_frames), and `fps` reports the
rate that spacing amounts to.
"""

from __future__ import annotations

import io
import math

import msgspec
import numpy as np

from rill.media.errors import VIDEO, VideoError
from rill.media.policy import MediaPolicy
from rill.media.sources import read_source

# FFmpeg's demuxer names; only these may open the bytes (no playlists or concat lists, which open
# other files and URLs by themselves).
FORMATS = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "avi")
_OPTIONS = {"format_whitelist": ",".join(FORMATS)}


class VideoFrames(msgspec.Struct, frozen=True):
    """Sampled frames of one video."""

    frames: np.ndarray  # [num_frames, height, width, 3] uint8 RGB, C-contiguous
    timestamps_s: tuple[float, ...]  # each sample's time t_k from the first frame, seconds
    fps: float  # the sampling rate: the requested fps, or num_frames / duration_s when max_frames spread them
    duration_s: float  # the video stream's duration
    source_fps: float | None  # the stream's average frame rate, where it has one

    @property
    def num_frames(self) -> int:
        return len(self.frames)


class _Probe(msgspec.Struct):
    num_packets: int
    start_s: float
    duration_s: float
    width: int
    height: int
    source_fps: float | None


def load_video(source, policy: MediaPolicy, *, fps: float, max_frames: int, param: str | None = None) -> VideoFrames:
    """Decode one video from `source` and sample its frames at `fps` frames a second, at most
    `max_frames` of them (and at most `policy.max_video_frames`).

    `source` is as for load_image (bytes, a "data:" URL, or, when `policy` allows them, an http(s)
    or file URL or a path). Blocking: call it off the trio thread.

    Returns VideoFrames: the frames as one uint8 array [T, H, W, 3] with their times in seconds. Raises
    MediaSourceError (code `invalid_video_url`) for a source that cannot be read and VideoError (code
    `invalid_video`) for bytes that cannot be used: not a video in FORMATS, no video stream, no frames,
    corrupt, or past a policy limit (frame size, duration, decoded frames, sampled pixels).
    """
    return decode_video(read_source(source, policy, kind=VIDEO, param=param), policy, fps=fps,
                        max_frames=max_frames, param=param)


def decode_video(data: bytes, policy: MediaPolicy, *, fps: float, max_frames: int,
                 param: str | None = None) -> VideoFrames:
    """Encoded video bytes -> sampled frames (see load_video)."""
    if not (isinstance(fps, (int, float)) and 0 < fps < math.inf):
        raise VideoError(f"fps must be a positive number of frames a second, got {fps!r}", "fps")
    if isinstance(max_frames, bool) or not isinstance(max_frames, int) or max_frames < 1:
        raise VideoError(f"max_frames must be an integer >= 1, got {max_frames!r}", "max_frames")
    if not data:
        raise VideoError("the video is empty", param)
    probe = _guarded(lambda: _probe(data, policy, param), param)
    _check_decoded_pixels(probe, policy, param)
    times, rate = sample_times(probe.duration_s, fps, min(max_frames, policy.max_video_frames))
    _check_sampled_pixels(len(times), probe, policy, param)
    frames = _guarded(lambda: _decode(data, probe, times, policy, param), param)
    return VideoFrames(frames, tuple(times), rate, probe.duration_s, probe.source_fps)


def sample_times(duration_s: float, fps: float, max_frames: int) -> tuple[list[float], float]:
    """(times, rate): t_k = k / fps while t_k < duration_s at `fps`, or, when that is more than
    max_frames, max_frames times spread evenly over the duration at max_frames / duration_s."""
    count = max(1, math.ceil(duration_s * fps - 1e-6))
    if count <= max_frames:
        return [k / fps for k in range(count)], float(fps)
    return [k * duration_s / max_frames for k in range(max_frames)], max_frames / duration_s


def _guarded(work, param: str | None):
    import av  # PyAV (FFmpeg) loads with the first video, not with the server

    try:
        return work()
    except VideoError:
        raise
    except MemoryError:
        raise
    except av.error.FFmpegError as exc:
        raise VideoError(f"could not decode the video: {exc.strerror or exc}", param) from None
    except Exception as exc:  # PyAV's own checks (ValueError, ...) on malformed streams
        raise VideoError(f"could not decode the video: {exc}", param) from None


def _open(data: bytes):
    import av

    return av.open(io.BytesIO(data), mode="r", container_options=_OPTIONS)


def _probe(data: bytes, policy: MediaPolicy, param: str | None) -> _Probe:
    import av

    try:
        container = _open(data)
    except av.error.FFmpegError as exc:
        raise VideoError(f"the bytes are not a video in a format this server reads (MP4/MOV, WebM/Matroska, AVI): "
                         f"{exc.strerror or exc}", param) from None
    with container:
        if not container.streams.video:
            raise VideoError("the file has no video stream", param)
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        _check_frame_size(width, height, policy, param)
        rate = float(stream.average_rate) if stream.average_rate else None
        first, last, count = _scan_packets(container, stream, policy, param)
    if count == 0 or first is None:
        raise VideoError("the video has no frames", param)
    tb = float(stream.time_base)
    duration_s = (last - first) * tb if last > first else (1 / rate if rate else 0.0)
    if duration_s > policy.max_video_seconds:
        raise VideoError(f"the video lasts {duration_s:.1f} s, past the limit of {policy.max_video_seconds:g} s", param)
    return _Probe(count, first * tb, duration_s, width, height, rate)


def _scan_packets(container, stream, policy: MediaPolicy, param: str | None):
    """(first pts, end of the last packet, packet count) in the stream's time base; no decoding."""
    first, last, count = None, 0, 0
    default_duration = int(1 / (stream.average_rate * stream.time_base)) if stream.average_rate else 0
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:  # the demuxer's flush packet
            continue
        count += 1
        if count > policy.max_video_decoded_frames:
            raise VideoError(f"the video has more than {policy.max_video_decoded_frames} frames", param)
        first = packet.pts if first is None else min(first, packet.pts)
        last = max(last, packet.pts + (packet.duration or default_duration))
    return first, last, count


def _decode(data: bytes, probe: _Probe, times: list[float], policy: MediaPolicy, param: str | None) -> np.ndarray:
    out = np.empty((len(times), probe.height, probe.width, 3), dtype=np.uint8)
    filled, previous, num_decoded = 0, None, 0
    with _open(data) as container:
        for frame in container.decode(container.streams.video[0]):
            num_decoded += 1
            if num_decoded > policy.max_video_decoded_frames:
                raise VideoError(f"the video has more than {policy.max_video_decoded_frames} frames", param)
            _check_frame_size(frame.width, frame.height, policy, param)
            t = _frame_time(frame, probe, num_decoded)
            while previous is not None and filled < len(times) and t > times[filled] + 1e-9:
                out[filled] = previous  # the frame on screen at times[filled]
                filled += 1
            if filled == len(times):
                break
            previous = _rgb(frame, probe)
    if previous is None:
        raise VideoError("the video has no frames that decode", param)
    out[filled:] = previous  # times after the last frame's start show the last frame
    return out


def _frame_time(frame, probe: _Probe, num_decoded: int) -> float:
    if frame.time is not None:
        return frame.time - probe.start_s
    return (num_decoded - 1) / probe.source_fps if probe.source_fps else 0.0


def _rgb(frame, probe: _Probe) -> np.ndarray:
    """RGB at the stream's size (a stream whose size changes midway is scaled back to its first)."""
    return frame.to_ndarray(width=probe.width, height=probe.height, format="rgb24")


def _check_frame_size(width: int, height: int, policy: MediaPolicy, param: str | None) -> None:
    if width < 1 or height < 1:
        raise VideoError(f"the video's frames are {width}x{height} pixels", param)
    if width * height > policy.max_video_frame_pixels:
        raise VideoError(f"the video's frames are {width}x{height} = {width * height} pixels, past the limit of "
                         f"{policy.max_video_frame_pixels}", param)


def _check_decoded_pixels(probe: _Probe, policy: MediaPolicy, param: str | None) -> None:
    """The decoder's work, bounded before it starts: every frame is decoded, sampled or not."""
    total = probe.num_packets * probe.width * probe.height
    if total > policy.max_video_decoded_pixels:
        raise VideoError(f"the video has {probe.num_packets} frames of {probe.width}x{probe.height}: {total} pixels "
                         f"to decode, past the limit of {policy.max_video_decoded_pixels}", param)


def _check_sampled_pixels(count: int, probe: _Probe, policy: MediaPolicy, param: str | None) -> None:
    total = count * probe.width * probe.height
    if total > policy.max_video_sampled_pixels:
        raise VideoError(f"{count} sampled frames of {probe.width}x{probe.height} are {total} pixels, past the limit "
                         f"of {policy.max_video_sampled_pixels}; ask for a lower fps or fewer frames", param)
