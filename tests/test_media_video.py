"""rill.media video: MP4 (H.264) and WebM (VP8/VP9) decoded by PyAV and sampled at an fps with a frame cap;
no-frame, non-video and bomb-like videos refused as invalid_video, each limit at and past it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from helpers_media import audio_only, data_url, make_video, red_circle, video_without_frames
from rill.media import MediaPolicy, MediaSourceError, VideoError, load_video, sample_times

POLICY = MediaPolicy()
LEVELS = [20 * k for k in range(10)]  # ten frames, one second at 10 fps, each its own grey


def levels_of(frames: np.ndarray) -> list[int]:
    return [int(round(float(f.mean()) / 20)) * 20 for f in frames]


@pytest.mark.parametrize(("fmt", "codec"), [("mp4", "libx264"), ("webm", "libvpx-vp9"), ("webm", "libvpx")])
def test_video_is_sampled_at_the_requested_fps(fmt, codec):
    data = make_video(LEVELS, fmt=fmt, codec=codec)
    video = load_video(data, POLICY, fps=2, max_frames=32)
    assert video.frames.shape == (2, 48, 64, 3) and video.frames.dtype == np.uint8
    assert video.timestamps_s == (0.0, 0.5) and video.fps == 2.0
    assert video.duration_s == pytest.approx(1.0) and video.source_fps == pytest.approx(10.0)
    assert levels_of(video.frames) == [0, 100]
    every = load_video(data, POLICY, fps=10, max_frames=32)
    assert levels_of(every.frames) == LEVELS


def test_faster_than_the_source_repeats_the_frame_on_screen():
    video = load_video(make_video(LEVELS[:4]), POLICY, fps=20, max_frames=32)
    assert video.num_frames == 8 and levels_of(video.frames) == [0, 0, 20, 20, 40, 40, 60, 60]


def test_max_frames_spreads_the_samples_over_the_whole_video():
    video = load_video(make_video(LEVELS), POLICY, fps=10, max_frames=4)
    assert video.timestamps_s == (0.0, 0.25, 0.5, 0.75) and video.fps == pytest.approx(4.0)
    assert levels_of(video.frames) == [0, 40, 100, 140]
    capped = load_video(make_video(LEVELS), MediaPolicy(max_video_frames=3), fps=10, max_frames=32)
    assert capped.num_frames == 3  # the policy's cap is under the caller's


def test_sample_times():
    assert sample_times(1.0, 2, 10) == ([0.0, 0.5], 2.0)
    assert sample_times(1.1, 2, 10) == ([0.0, 0.5, 1.0], 2.0)
    assert sample_times(0.01, 2, 10) == ([0.0], 2.0)
    assert sample_times(10.0, 2, 4) == ([0.0, 2.5, 5.0, 7.5], 0.4)


def test_video_from_a_data_url():
    data = make_video(LEVELS, fmt="webm", codec="libvpx-vp9")
    assert load_video(data_url(data, "video/webm"), POLICY, fps=1, max_frames=4).num_frames == 1


def test_a_video_with_no_frames_is_invalid_video():
    with pytest.raises(VideoError, match="no frames") as info:
        load_video(video_without_frames(), POLICY, fps=1, max_frames=4, param="messages[0].content[0].video_url.url")
    assert info.value.code == "invalid_video" and info.value.param == "messages[0].content[0].video_url.url"


def test_audio_only_pictures_and_noise_are_invalid_video():
    with pytest.raises(VideoError, match="no video stream"):
        load_video(audio_only(), POLICY, fps=1, max_frames=4)
    for data in (red_circle(32), b"not a video at all", b"\x00" * 4096):
        with pytest.raises(VideoError, match="not a video in a format"):
            load_video(data, POLICY, fps=1, max_frames=4)
    with pytest.raises(VideoError, match="empty"):
        load_video(b"", POLICY, fps=1, max_frames=4)


def test_truncated_video_is_invalid_video():
    data = make_video(LEVELS * 2)
    with pytest.raises(VideoError):
        load_video(data[: len(data) // 2], POLICY, fps=1, max_frames=4)


def test_fps_and_max_frames_are_checked():
    data = make_video(LEVELS)
    for fps in (0, -1, float("nan"), float("inf")):
        with pytest.raises(VideoError, match="fps"):
            load_video(data, POLICY, fps=fps, max_frames=4)
    for max_frames in (0, 1.5, True):
        with pytest.raises(VideoError, match="max_frames"):
            load_video(data, POLICY, fps=1, max_frames=max_frames)


def test_a_small_file_of_many_frames_is_refused_before_decoding():
    data = make_video([0] * 3000, rate=30)  # 100 s of black in well under 100 kB
    assert len(data) < 150_000
    started = time.perf_counter()
    with pytest.raises(VideoError, match="more than 1000 frames"):
        load_video(data, MediaPolicy(max_video_decoded_frames=1000), fps=1, max_frames=4)
    assert time.perf_counter() - started < 1.0  # the packet scan alone decided
    with pytest.raises(VideoError, match="past the limit of 60 s"):
        load_video(data, MediaPolicy(max_video_seconds=60), fps=1, max_frames=4)


def test_decoded_frame_limit_at_and_past():
    data = make_video(LEVELS)
    assert load_video(data, MediaPolicy(max_video_decoded_frames=10), fps=1, max_frames=4).num_frames == 1
    with pytest.raises(VideoError, match="more than 9 frames"):
        load_video(data, MediaPolicy(max_video_decoded_frames=9), fps=1, max_frames=4)


def test_duration_limit_at_and_past():
    data = make_video(LEVELS)  # exactly 1.0 s
    assert load_video(data, MediaPolicy(max_video_seconds=1.0), fps=1, max_frames=4).num_frames == 1
    with pytest.raises(VideoError, match="lasts 1.0 s"):
        load_video(data, MediaPolicy(max_video_seconds=0.95), fps=1, max_frames=4)


def test_frame_size_limit_at_and_past():
    data = make_video(LEVELS[:2], size=(64, 48))
    assert load_video(data, MediaPolicy(max_video_frame_pixels=64 * 48), fps=1, max_frames=4).num_frames == 1
    with pytest.raises(VideoError, match="64x48 = 3072 pixels"):
        load_video(data, MediaPolicy(max_video_frame_pixels=64 * 48 - 1), fps=1, max_frames=4)


def test_sampled_pixel_limit_at_and_past():
    data = make_video(LEVELS)
    at = MediaPolicy(max_video_sampled_pixels=4 * 64 * 48)
    assert load_video(data, at, fps=4, max_frames=32).num_frames == 4
    with pytest.raises(VideoError, match="lower fps or fewer frames"):
        load_video(data, at, fps=5, max_frames=32)


def test_remote_video_url_is_refused_when_remote_media_is_off():
    with pytest.raises(MediaSourceError) as info:
        load_video("https://example.com/clip.mp4", POLICY, fps=1, max_frames=4)
    assert info.value.code == "invalid_video_url"
