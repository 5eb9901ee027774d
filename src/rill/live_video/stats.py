"""Live video counters: one LiveVideoStats per server (on its Serving), read by /metrics; each feed
also keeps its own (FeedCounts) for its session's status and events."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class FeedCounts:
    num_frames_received: int = 0  # decoded frames that reached the feed
    num_frames_dropped: int = 0  # dropped by the pacer (the encoder had not caught up)
    num_frames_appended: int = 0  # in the engine's prompt (as video pieces)
    num_frames_trimmed: int = 0  # left the context through the window (rebases)
    num_rebases: int = 0  # rebases asked for
    num_bad_frames: int = 0  # refused: not an image, too large, a timestamp going back


@dataclass
class LiveVideoStats(FeedCounts):
    num_feeds: int = 0  # live feeds opened
    num_open_feeds: int = 0

    def add(self, name: str, n: int = 1) -> None:
        setattr(self, name, getattr(self, name) + n)


METRICS = (
    ("rill_live_video_frames_received", "Live video frames decoded and offered to a feed.", "num_frames_received"),
    ("rill_live_video_frames_dropped", "Live video frames dropped because the encoder had not caught up "
     "(the newest are kept).", "num_frames_dropped"),
    ("rill_live_video_frames_appended", "Live video frames appended to a prompt.", "num_frames_appended"),
    ("rill_live_video_frames_trimmed", "Live video frames that left a context through its window.",
     "num_frames_trimmed"),
    ("rill_live_video_rebases", "Contexts re-prefilled without their oldest frames.", "num_rebases"),
    ("rill_live_video_bad_frames", "Live video frames refused (undecodable, too large, out of order).",
     "num_bad_frames"),
    ("rill_live_video_feeds", "Live video feeds opened.", "num_feeds"),
)

assert {m[2] for m in METRICS} <= {f.name for f in fields(LiveVideoStats)}
