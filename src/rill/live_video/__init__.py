"""Live video: camera frames that stream into a session's prompt as they arrive, so that a question
asked at any moment is answered about one engine step after it ends.

From the wire inwards; each module imports only modules below it:

    feed      LiveFeed: one stream's frames (and ordered text steps) into its engine session, paced by
              the engine's progress, its window kept by rebases
    segments  SegmentDecoder: encoded video segments (WebM/MP4 fragments) decoded as they arrive
    frames    one frame's bytes (base64 JPEG/PNG/WebP) -> RGB pixels, timestamps
    pacer     FrameInbox: frames and steps in order; past the limit the oldest waiting frame is dropped
    context   LiveContext: the prompt as text and video segments; the window leaves old frames out
    framing   the model's video framing; frames -> pieces (one temporal patch each) by its processor
    config    LiveVideoConfig and `rill serve` flags; stats: counters for /metrics

The engine side is rill.engine.live_sessions (progress, rebase); the transports are Mode A/B
(rill.openai.streaming_video) and the realtime API (rill.transports.realtime.video).
"""
