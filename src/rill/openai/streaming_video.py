"""Camera frames in Mode A and Mode B: `{"modality": "image", "payload": base64 JPEG/PNG, "timestamp_ms": t}`
chunks, and `{"modality": "video", "payload": base64 WebM/MP4 bytes}` chunks (a MediaRecorder stream,
decoded as it arrives and sampled at --live-video-fps), prefilled as they arrive (rill.live_video).

Frames are decoded off the trio thread before their chunk is accepted (`prepare`), so a bad frame is
refused alone (400 `invalid_image`, the session goes on). In sequence order, frames join the session's
live video, a piece (two frames) at a time; a text or tokens chunk closes the video and follows it,
and the next frames start a new one. The first image or video chunk starts a RunVideo; from then on
every chunk of the run goes through its feed, so the order holds. Sessions that answer each chunk
(`respond_per_chunk`) and sessions that also carry audio do not take frames.
"""

from __future__ import annotations

import base64
import binascii

import msgspec
import trio

from rill.errors import ValidationError
from rill.live_video.context import LiveContext
from rill.live_video.feed import LiveFeed
from rill.live_video.frames import Frame, decode_frame
from rill.live_video.framing import PieceMaker, video_framing
from rill.live_video.segments import SegmentDecoder, starts_stream
from rill.media.errors import VideoError
from rill.sessions.chunks import InputChunk, Modality
from rill.sessions.errors import UnsupportedModality

FRAME_MODALITIES = (Modality.IMAGE, Modality.VIDEO)


class VideoStatus(msgspec.Struct):
    """A session's frames, in its Mode B status."""

    num_frames_received: int
    num_frames_dropped: int
    num_frames_appended: int
    num_frames_in_context: int
    num_frames_trimmed: int
    num_rebases: int
    num_bad_frames: int
    error: str | None = None  # the last video stream that failed to decode


def check_frame_chunk(run, chunk: InputChunk) -> None:
    """Before a frame chunk is decoded: the session and the model can take it."""
    if run.mode.value == "respond_per_chunk":
        raise UnsupportedModality("frames stream into sessions that answer at the end of input; this one answers "
                                  "every chunk (output_mode respond_per_chunk)", param="modality")
    if run.audio is not None:
        raise UnsupportedModality("a session takes audio or frames, not both", param="modality")
    if run.video is None:
        video_framing(run.serving.tokenizer, run.serving.mm_inputs)  # the model reads video


async def prepare_frame(run, chunk: InputChunk):
    """Decode an image chunk (or check a video chunk's bytes) off the trio thread; what `take` needs."""
    check_frame_chunk(run, chunk)
    try:
        if chunk.modality is Modality.IMAGE:
            ts = None if chunk.timestamp_ms is None else chunk.timestamp_ms / 1000
            return await trio.to_thread.run_sync(decode_frame, chunk.payload, run.serving.options.media, "payload", ts)
        return _segment_bytes(chunk, run.video)
    except ValidationError:
        run.serving.live_video.add("num_bad_frames")
        raise


def _segment_bytes(chunk: InputChunk, video) -> bytes:
    try:
        data = base64.b64decode(chunk.payload, validate=True)
    except (binascii.Error, ValueError):
        raise VideoError("a video chunk's payload must be base64 (WebM or MP4 bytes)", "payload") from None
    if not data:
        raise VideoError("the video chunk is empty", "payload")
    if not starts_stream(data) and (video is None or video.decoder is None):
        raise VideoError("a video stream must begin with its container's header (WebM or fragmented MP4, as "
                         "MediaRecorder's first blob)", "payload")
    return data


class RunVideo:
    """The frame side of one StreamRun (rill.openai.streaming); it is the feed's sink."""

    def __init__(self, run, config):
        serving = run.serving
        self.run = run
        self.request_id = run.request_id
        self.context = LiveContext(video_framing(serving.tokenizer, serving.mm_inputs))
        self.context.add_text(run.ids)  # everything the engine session holds so far
        self.num_sent = len(run.ids)
        self.fps = config.video_fps
        maker = PieceMaker(serving.mm_inputs, config.video_fps)
        self.feed = LiveFeed(serving.engine, self, maker, self.context, config, serving.live_video,
                             max_tokens=serving.max_model_len // 2)
        self.decoder: SegmentDecoder | None = None
        self._deferred: list = []  # what came after a stream still decoding, in order
        self._finishing = False
        self.error: str | None = None
        self._stream_offset_s = 0.0  # timestamps of a new segment stream follow the last one's
        self._nursery: trio.Nursery | None = None
        self._scope = trio.CancelScope()
        self._started = trio.Event()
        run.manager.start_soon(self._run)

    async def _run(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._started.set()
                await self.feed.run()

    def close(self) -> None:
        self._scope.cancel()
        self.feed.close()
        if self.decoder is not None:
            self.decoder.end()

    # -- chunks, in sequence order ------------------------------------------------------------------
    #
    # A video stream's frames come out of its decoder some time after its bytes went in, so while one
    # decodes, what comes after it waits (`_deferred`): any other chunk ends the stream, and runs once
    # its last frame is out. A new stream's header likewise waits for the stream before it.

    def take(self, chunk: InputChunk, prepared) -> None:
        if chunk.modality is Modality.VIDEO and not starts_stream(prepared) and self.is_decoding:
            self.decoder.feed(prepared)  # the stream goes on
            return
        if chunk.modality is Modality.IMAGE:
            action = lambda: self._put_frame(prepared)  # noqa: E731
        elif chunk.modality is Modality.VIDEO:
            action = lambda: self._start_stream(prepared)  # noqa: E731
        else:
            action = lambda: self.feed.put_step(lambda: self.run._guard(lambda: self.run._apply(chunk)))  # noqa: E731
        self._then(action)

    def finish(self) -> None:
        """End of input (idempotent): after the frames before it (a decoding stream's last frames too)."""
        if not self._finishing:
            self._finishing = True
            self._then(lambda: self.feed.put_step(lambda: self.run._guard(self.run._finish_input)))

    @property
    def is_decoding(self) -> bool:
        return self.decoder is not None and not self.decoder.done

    def _then(self, action) -> None:
        if self.is_decoding or self._deferred:
            if self.decoder is not None:
                self.decoder.end()
            self._deferred.append(action)
        else:
            action()

    def _put_frame(self, frame: Frame) -> None:
        last = self.feed.last_timestamp_s  # a timestamp going back (chunks reordered) is held at the last
        if frame.timestamp_s is not None and last is not None and frame.timestamp_s < last:
            frame = Frame(frame.pixels, last)
        self.feed.note_timestamp(frame.timestamp_s)
        self.feed.put_frame(frame)

    def _start_stream(self, data: bytes) -> None:
        if self.decoder is not None:
            self._stream_offset_s = (self.feed.last_timestamp_s or 0.0) + 1 / self.fps
        self.decoder = SegmentDecoder(self.run.serving.options.media, self.fps, self._on_decoded,
                                      self._on_decode_error)
        self.decoder.feed(data)
        self._start(self._decode, self.decoder)

    async def _decode(self, decoder: SegmentDecoder) -> None:
        try:
            await decoder.run()
        finally:
            while self._deferred and not self.is_decoding:
                self._deferred.pop(0)()

    def _start(self, fn, *args) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)
        else:  # the feed task has not run yet: start once it has
            async def later():
                await self._started.wait()
                self._nursery.start_soon(fn, *args)

            self.run.manager.start_soon(later)

    def _on_decoded(self, pixels, time_s: float) -> None:
        if self.feed.closed:
            return
        self._put_frame(Frame(pixels, self._stream_offset_s + time_s))

    def _on_decode_error(self, exc: VideoError) -> None:
        self.error = exc.message
        self.run.serving.live_video.add("num_bad_frames")
        self.feed.counts.num_bad_frames += 1

    # -- the feed's sink ------------------------------------------------------------------------------

    def flush_text(self) -> None:
        held = self.run.encoder.flush()  # text before the video is final: a special token comes next
        if held:
            self.run._append(held, "")

    def append_media(self, ids: list[int], items: list) -> None:
        self.run._append(ids, "", mm_items=items, media=True)

    def on_sent(self, ids: list[int], media: bool) -> None:
        """StreamRun._append sent ids to the engine session: text joins the context."""
        self.num_sent += len(ids)
        if not media:
            self.context.add_text(ids)

    def rebased(self, ids: list[int]) -> None:
        self.run.ids = list(ids)

    def status(self) -> VideoStatus:
        c = self.feed.counts
        return VideoStatus(c.num_frames_received, c.num_frames_dropped, c.num_frames_appended,
                           self.context.num_frames, c.num_frames_trimmed, c.num_rebases, c.num_bad_frames, self.error)
