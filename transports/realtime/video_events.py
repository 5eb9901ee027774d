"""The realtime protocol's frame events (server -> client). The client's are in `events`
(`input_video_frame.append` / `.commit`, vLLM's streaming-video proposal, RFC vllm-project/vllm#38141)."""

from __future__ import annotations

from rill.transports.realtime.events import ServerEvent


class InputVideoFrameDropped(ServerEvent, tag="input_video_frame.dropped"):
    """rill's: frames came faster than the encoder took them, and the oldest waiting one was dropped (the
    newest are kept). `num_frames_dropped` counts the connection's drops so far."""

    num_frames_dropped: int
