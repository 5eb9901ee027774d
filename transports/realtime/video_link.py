"""A realtime connection's frames on the real engine: its LiveFeed (rill.live_video) and the decoding of
input_image parts run as tasks in the connection's nursery; what they report joins the connection's
inbox in order, as events the sans-IO handler takes (`RealtimeConnection.receive_video`).
"""

from __future__ import annotations

import math

import msgspec
import trio

from rill.errors import ValidationError


class FrameRefused(msgspec.Struct, frozen=True):
    """A frame that could not be used (not an image, too large, a timestamp going back)."""

    event_id: str | None
    code: str
    message: str


class FramesDropped(msgspec.Struct, frozen=True):
    num_frames_dropped: int  # the connection's total so far


class VideoDrained(msgspec.Struct, frozen=True):
    """Every frame before the events held behind them is in the prompt: they may go on."""


class ImagesDecoded(msgspec.Struct, frozen=True):
    """A conversation.item.create's input_image parts, processed (or why they could not be)."""

    item_id: str
    items: list = []  # rill.multimodal.inputs.MultiModalItem, in part order
    code: str | None = None
    message: str | None = None
    param: str | None = None


class TextInOrder(msgspec.Struct, frozen=True):
    """Text (or a commit) sent during an answer after frames that wait for the next message: the feed
    has put those frames in and stopped; the text goes in now, then the feed goes on (VideoInput)."""

    text: str
    commit: bool = False


VIDEO_EVENTS = (FrameRefused, FramesDropped, VideoDrained, ImagesDecoded, TextInOrder)


class VideoLink:
    def __init__(self, nursery: trio.Nursery, inbox: trio.MemorySendChannel):
        self._nursery = nursery
        # Unbounded, drained by one task into the (bounded) inbox: the feed never blocks on the client.
        # What it carries is bounded by the frames a client sends (one event each at most).
        self._send, recv = trio.open_memory_channel(math.inf)
        nursery.start_soon(self._pump, recv, inbox)

    @staticmethod
    async def _pump(recv, inbox) -> None:
        async with recv:
            async for event in recv:
                await inbox.send(event)

    def post(self, event) -> None:
        self._send.send_nowait(event)

    def start_feed(self, feed) -> None:
        feed.on_bad_frame = lambda tag, exc: self.post(FrameRefused(tag, exc.code, exc.message))
        feed.on_drop = lambda total: self.post(FramesDropped(total))
        self._nursery.start_soon(feed.run)

    def decode_images(self, item_id: str, decode) -> None:
        """Run decode() -> list of items in a worker thread; ImagesDecoded joins the inbox."""
        async def run() -> None:
            try:
                items = await trio.to_thread.run_sync(decode)
                self.post(ImagesDecoded(item_id, items))
            except ValidationError as exc:
                self.post(ImagesDecoded(item_id, code=exc.code, message=exc.message, param=exc.param))

        self._nursery.start_soon(run)
