"""Live video settings: the context window of a frame stream, frame pacing, and the frame rate of
video segments. `rill serve` fills LiveVideoConfig from flags and RILL_* variables."""

from __future__ import annotations

import argparse
import os

import msgspec

DEFAULT_MAX_FRAMES = 32  # as a chat request's video (rill.openai.chat_media.VIDEO_MAX_FRAMES)


class LiveVideoConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A frame stream's context keeps its newest `max_frames` frames (and, with `max_seconds`, only those
    that many seconds from the newest). Older frames leave it `rebase_frames` at a time: the shorter
    context is prefilled again beside the live one (rill.engine.live_sessions), so the context holds
    between max_frames and max_frames + rebase_frames frames."""

    max_frames: int = DEFAULT_MAX_FRAMES
    max_seconds: float | None = None
    rebase_frames: int | None = None  # None: max_frames // 2 (at least 2)
    # Pacing: frames whose tokens are appended but not yet in the KV cache (the encoder and prefill
    # have not caught up) are at most `max_frames_in_flight`; a frame that arrives meanwhile waits,
    # and at most `max_waiting_frames` wait: past that the oldest waiting frame is dropped.
    max_frames_in_flight: int = 4
    max_waiting_frames: int = 2
    video_fps: float = 2.0  # frames a second sampled from video segments (modality "video")

    def __post_init__(self):
        if self.max_frames < 2:
            raise ValueError(f"live video max_frames must be >= 2, got {self.max_frames}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"live video max_seconds must be > 0, got {self.max_seconds}")
        if self.rebase_frames is not None and self.rebase_frames < 2:
            raise ValueError(f"live video rebase_frames must be >= 2, got {self.rebase_frames}")
        if self.max_frames_in_flight < 2 or self.max_waiting_frames < 1:
            raise ValueError("live video: max_frames_in_flight must be >= 2 and max_waiting_frames >= 1")
        if not 0 < self.video_fps <= 30:
            raise ValueError(f"live video fps must be in (0, 30], got {self.video_fps}")

    @property
    def stride_frames(self) -> int:
        return self.rebase_frames or max(2, self.max_frames // 2)

    @classmethod
    def from_env(cls) -> LiveVideoConfig:
        env = os.environ.get
        seconds, rebase = env("RILL_LIVE_VIDEO_MAX_SECONDS"), env("RILL_LIVE_VIDEO_REBASE_FRAMES")
        return cls(
            max_frames=int(env("RILL_LIVE_VIDEO_MAX_FRAMES", DEFAULT_MAX_FRAMES)),
            max_seconds=float(seconds) if seconds else None,
            rebase_frames=int(rebase) if rebase else None,
            max_frames_in_flight=int(env("RILL_LIVE_VIDEO_MAX_FRAMES_IN_FLIGHT", 4)),
            max_waiting_frames=int(env("RILL_LIVE_VIDEO_MAX_WAITING_FRAMES", 2)),
            video_fps=float(env("RILL_LIVE_VIDEO_FPS", 2.0)),
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = LiveVideoConfig.from_env()
    g = parser.add_argument_group("live video (image and video chunks, realtime input_video_frame.append)")
    g.add_argument("--live-video-max-frames", type=int, default=env.max_frames,
                   help="frames a stream's context keeps (the newest) [RILL_LIVE_VIDEO_MAX_FRAMES]")
    g.add_argument("--live-video-max-seconds", type=float, default=env.max_seconds,
                   help="and only frames this many seconds from the newest (by timestamp_ms; default: no limit) "
                        "[RILL_LIVE_VIDEO_MAX_SECONDS]")
    g.add_argument("--live-video-rebase-frames", type=int, default=env.rebase_frames,
                   help="older frames leave the context this many at a time (default max_frames/2) "
                        "[RILL_LIVE_VIDEO_REBASE_FRAMES]")
    g.add_argument("--live-video-max-frames-in-flight", type=int, default=env.max_frames_in_flight,
                   help="frames sent to the engine and not yet encoded and prefilled [RILL_LIVE_VIDEO_MAX_FRAMES_IN_FLIGHT]")
    g.add_argument("--live-video-max-waiting-frames", type=int, default=env.max_waiting_frames,
                   help="frames waiting for the encoder; past it the oldest is dropped [RILL_LIVE_VIDEO_MAX_WAITING_FRAMES]")
    g.add_argument("--live-video-fps", type=float, default=env.video_fps,
                   help="frames a second taken from video segments [RILL_LIVE_VIDEO_FPS]")


def from_args(args: argparse.Namespace) -> LiveVideoConfig:
    return LiveVideoConfig(
        max_frames=args.live_video_max_frames, max_seconds=args.live_video_max_seconds,
        rebase_frames=args.live_video_rebase_frames, max_frames_in_flight=args.live_video_max_frames_in_flight,
        max_waiting_frames=args.live_video_max_waiting_frames, video_fps=args.live_video_fps,
    )
