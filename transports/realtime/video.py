"""Frames and pictures in a realtime connection.

    input_video_frame.append  -> the connection's LiveFeed (rill.live_video): decoded in a worker thread,
                                 two frames a piece of the live video in the user message being built,
                                 prefilled as they come; the window trims old frames by rebases; frames
                                 faster than the encoder are dropped (input_video_frame.dropped); a bad
                                 frame is an error event naming the frame's event_id, and the stream goes on
    input_video_frame.commit  -> the message so far (vLLM's `query` appended after the frames) is committed;
                                 with a query the answer starts (OpenAI's response.* events)
    conversation.item.create  -> input_image parts (OpenAI GA) are decoded and processed off the trio thread,
                                 then the item joins the conversation; a user text message created while the
                                 camera streams into the open message joins that message after its frames
                                 (the question about what was seen), and is committed

The open user message is the connection's STREAMING turn: its context (rill.live_video.context) holds the
conversation rendered so far, pictures and earlier videos placed, and the message's own text and video.
Frames wait while no turn takes them (a response generates, or a message is committed and unanswered)
and open the next turn after it. Events that change the prompt (text, commits, items, response.create,
recognised words) wait behind frames not yet in it, so every input keeps its place (`holds`); text sent
during an answer after frames that wait for the next message goes behind them in the feed (`behind_frames`).
"""

from __future__ import annotations

from rill.errors import ValidationError
from rill.live_video.context import LiveContext, Video
from rill.live_video.feed import LiveFeed
from rill.live_video.frames import RawFrame
from rill.live_video.framing import PieceMaker, video_framing
from rill.media import load_image
from rill.multimodal.inputs import IMAGE
from rill.speech.live import TranscriptDelta, TranscriptDone
from rill.transports.realtime.conversation import item_text
from rill.transports.realtime.events import (
    ContentPart, ConversationItemCreate, InputAudioBufferCommit, InputTextBufferAppend,
    InputTextBufferCommit, InputVideoFrameCommit, Item, RealtimeError, ResponseCreate, error_event, new_id,
)
from rill.transports.realtime.state import State
from rill.transports.realtime.video_events import InputVideoFrameDropped
from rill.transports.realtime.video_link import FrameRefused, FramesDropped, ImagesDecoded, TextInOrder, VideoDrained

# What waits behind frames not yet in the prompt: everything that adds to it or ends the message.
PROMPT_EVENTS = (InputTextBufferAppend, InputTextBufferCommit, ConversationItemCreate, ResponseCreate,
                 InputVideoFrameCommit, InputAudioBufferCommit, TranscriptDelta, TranscriptDone)


class VideoInput:
    def __init__(self, conn, link):
        self.conn, self.link = conn, link
        serving = conn.serving
        self.sees = serving.mm_inputs is not None  # pictures in items
        try:
            self.framing = video_framing(serving.tokenizer, serving.mm_inputs)
        except ValidationError as exc:
            self.framing, self._no_video = None, exc.message
        self.feed: LiveFeed | None = None
        self.turn = None  # the InputTurn the feed appends to
        self.media: dict[str, list] = {}  # item id -> its pictures (MultiModalItem) and videos (Video), in order
        self._held: list = []  # events waiting (client events, recognised words), in order
        self._num_holds = 0  # reasons to hold: frames draining (one at a time), pictures decoding
        self._draining = False
        self._decoding: dict[str, tuple[Item, str | None, str | None]] = {}  # item id -> (item, previous, event id)

    # -- holding --------------------------------------------------------------------------------------------------

    def holds(self, event) -> bool:
        """Whether `event` must wait (it is kept, and replayed in order once what it waits for is in)."""
        if self._num_holds:
            self._held.append(event)
            return True
        if isinstance(event, PROMPT_EVENTS) and self.feed is not None and self.feed.is_busy:
            self._drain()
            self._held.append(event)
            return True
        return False

    def _drain(self) -> None:
        self._num_holds += 1
        self._draining = True
        self.feed.put_step(lambda: self.link.post(VideoDrained()))  # after the frames before it, video closed

    def _release(self) -> None:
        self._num_holds -= 1
        if self._num_holds:
            return
        queue, self._held = self._held, []
        for event in queue:  # each may hold again: then the rest queue behind it, in order
            self.conn.replay(event)

    def on_event(self, event) -> None:
        match event:
            case VideoDrained():
                self._draining = False
                self._release()
            case FrameRefused():
                error = RealtimeError(event.code, event.message, "image")
                self.conn.emit(error_event(error, event.event_id))
            case FramesDropped():
                self.conn.emit(InputVideoFrameDropped(num_frames_dropped=event.num_frames_dropped))
            case ImagesDecoded():
                self._images_decoded(event)
            case TextInOrder():
                self._text_in_order(event)

    # -- text during an answer, behind frames that wait for the next message -------------------------------------

    def behind_frames(self, text: str, commit: bool = False) -> bool:
        """During an answer, frames wait (the feed is paused) for the next message. Text (or a commit) sent
        after them goes behind them in the feed, so that message keeps the order they came in; text sent
        before any frame waits in the connection as usual (it opens the next message, frames follow)."""
        feed = self.feed
        if feed is None or not feed.paused or not (len(feed.inbox) or feed.has_frames):
            return False

        def step() -> None:  # in the feed's task, the frames before it in the prompt and their video closed
            feed.pause()
            self._num_holds += 1  # events wait until the text is in (or a response.create would pass it)
            self.link.post(TextInOrder(text, commit))

        feed.put_step(step)
        return True

    def _text_in_order(self, event: TextInOrder) -> None:
        conn = self.conn
        try:
            if event.text:
                conn.append_text(event.text)
            if event.commit:
                conn.commit_text()
        finally:
            if self.turn is not None and self.turn is conn.turn:
                self.feed.resume()
            self._release()

    # -- frames ----------------------------------------------------------------------------------------------------

    def append_frame(self, event) -> None:
        conn = self.conn
        if self.framing is None:
            raise RealtimeError("unsupported_modality", f"frames need a model that reads video: {self._no_video}",
                                "image")
        if conn.settings.output_mode != "respond_at_end" or conn.settings.session_type != "realtime":
            raise RealtimeError("unsupported_modality", "frames stream into realtime sessions that answer when asked "
                                "(output_mode respond_at_end)", "session.output_mode")
        ts = event.timestamp_ms / 1000 if event.timestamp_ms is not None else event.timestamp
        if ts is not None and ts < 0:
            raise RealtimeError("invalid_value", "a frame's timestamp must be >= 0", "timestamp")
        if not event.image:
            raise RealtimeError("invalid_image", "`image` is empty", "image")
        self._feed().put_frame(RawFrame(event.image, ts, event.event_id))
        self._place()

    def commit(self, event) -> None:
        """vLLM's input_video_frame.commit: the message so far, with `query` after its frames; the answer."""
        conn = self.conn
        if event.query:
            conn.append_text(event.query)
        if conn.state is not State.STREAMING:
            raise RealtimeError("input_video_frame_commit_empty", "there are no frames or text to commit", None)
        conn.commit_text()
        if event.query:
            conn.create_response(None)

    def _feed(self) -> LiveFeed:
        if self.feed is None:
            serving = self.conn.serving
            config = serving.options.live_video
            maker = PieceMaker(serving.mm_inputs, config.video_fps)
            self.feed = LiveFeed(serving.engine, self, maker, LiveContext(self.framing), config, serving.live_video,
                                 max_tokens=serving.max_model_len // 2, policy=serving.options.media)
            self.feed.pause()
            self.link.start_feed(self.feed)
        return self.feed

    def _place(self) -> None:
        """Frames go to the open user message; without one, they open it, or wait for the next."""
        conn = self.conn
        if conn.state is State.IDLE:
            conn.open_input("")  # -> on_turn_opened
        elif conn.state is State.STREAMING and self.turn is not conn.turn:
            self.on_turn_opened(conn.turn)
        elif conn.state is not State.STREAMING:
            self.feed.pause()

    def after_response(self) -> None:
        feed = self.feed
        if feed is not None and (feed.has_frames or len(feed.inbox)) and self.conn.state in (State.IDLE,
                                                                                             State.STREAMING):
            self._place()

    # -- turns -----------------------------------------------------------------------------------------------------

    def on_turn_opened(self, turn) -> None:
        if self.feed is not None and turn.context is not None and turn.context.framing is not None:
            self.turn = turn
            self.feed.retarget(turn.context)
            self.feed.resume()

    def on_turn_closed(self) -> None:
        self.turn = None
        if self.feed is not None:
            self.feed.pause()

    def open_turn(self, turn, ids: list[int]) -> tuple[list[int], list]:
        """A new turn's opening prompt (the conversation rendered, one placeholder per picture and video):
        the media placed, and the turn's context set when the model reads pictures or video."""
        media = self.media_in_order()
        if self.framing is None and not media:
            return ids, []
        turn.context = LiveContext.from_placeholders(self.framing, ids, media, self._image_pad())
        ids, items = turn.context.prompt()
        turn.num_sent = len(ids)
        return ids, items

    def expand(self, ids: list[int]) -> tuple[list[int], list]:
        """A whole prompt's placeholders (response.create without an open turn)."""
        media = self.media_in_order()
        if not media:
            return ids, []
        return LiveContext.from_placeholders(self.framing, ids, media, self._image_pad()).prompt()

    def _image_pad(self) -> int | None:
        return self.conn.serving.mm_inputs.placeholder(IMAGE) if self.sees else None

    # -- the turn's text (the connection sends it; the context mirrors it) -------------------------------------

    def before_text(self, turn) -> None:
        """Text follows in the message: an open video ends first."""
        if turn.context is not None:
            ids = turn.context.close_video()
            if ids:
                self.conn.engine.append(turn.request_id, ids)
                turn.num_sent += len(ids)

    def on_sent(self, turn, ids: list[int]) -> None:
        turn.num_sent += len(ids)
        if turn.context is not None:
            turn.context.add_text(ids)

    @staticmethod
    def on_text(turn, text: str) -> None:
        if text:
            if turn.parts and isinstance(turn.parts[-1], str):
                turn.parts[-1] += text
            else:
                turn.parts.append(text)

    # -- the feed's sink ---------------------------------------------------------------------------------------

    @property
    def request_id(self) -> str:
        return self.turn.request_id

    @property
    def num_sent(self) -> int:
        return self.turn.num_sent

    def flush_text(self) -> None:
        ids = self.turn.encoder.flush()
        if ids:
            self.conn.send(self.turn, ids)

    def append_media(self, ids: list[int], items: list) -> None:
        turn = self.turn
        self.conn.engine.append(turn.request_id, ids, items)
        turn.num_sent += len(ids)
        if items and not items[0].continues:  # a new video in the message
            turn.parts.append(turn.context.segments[-1])

    def rebased(self, ids: list[int]) -> None:
        pass  # the turn's length is its context's (InputTurn.num_tokens)

    # -- items -------------------------------------------------------------------------------------------------

    def content(self, item: Item) -> str | list[dict]:
        """An item as chat-template content: text, or parts with its pictures and (untrimmed) videos."""
        media = self.media.get(item.id)
        if not media:
            return item_text(item)
        parts, queue = [], list(media)
        for part in item.content:
            if part.type == "input_image":
                queue.pop(0)
                parts.append({"type": "image"})
            elif part.type == "input_video":
                if queue.pop(0).pieces:
                    parts.append({"type": "video"})
            else:
                parts.append({"type": "text", "text": part.text if part.text is not None else part.transcript or ""})
        return parts

    def media_in_order(self) -> list:
        return [m for item in self.conn.conversation.in_context for m in self.media.get(item.id, ())
                if not (isinstance(m, Video) and not m.pieces)]

    def audio_index(self) -> int:
        """Where the audio part of the message being spoken will stand (user_item puts it where the words
        began): after the live video parts that came before the first words, 0 without video."""
        parts = self.turn.parts if self.turn is not None else ()
        return next((k for k, part in enumerate(parts) if not isinstance(part, Video)), len(parts))

    def user_item(self, turn, spoken: Item | None = None) -> Item | None:
        """The committed message, when it holds video: its parts in the order they came. `spoken`: the
        message was said (an input_audio item, its transcript the turn's text): its audio part stands where
        the words began, in place of their text."""
        if not any(isinstance(p, Video) for p in turn.parts):
            return None
        audio = spoken.content[0] if spoken is not None else None
        content = []
        for part in turn.parts:
            if isinstance(part, Video):
                content.append(ContentPart("input_video", num_frames=part.num_frames))
            elif audio is None:
                content.append(ContentPart("input_text", text=part))
            elif not any(c is audio for c in content):
                content.append(audio)
        if audio is not None and not any(c is audio for c in content):
            content.append(audio)  # nothing was heard yet: the (empty) audio part closes the message
        item = spoken or Item(type="message", id=new_id("item"), role="user", status="completed")
        item.content = content
        self.media[item.id] = [p for p in turn.parts if isinstance(p, Video)]
        return item

    def joins(self, item: Item, previous_item_id: str | None) -> bool:
        """A user text message created at the end while the camera streams into the open message: it is
        the question about what was seen, so it joins that message after its frames and commits it."""
        conn, turn = self.conn, self.conn.turn
        if (previous_item_id is not None or item.role != "user" or conn.state is not State.STREAMING
                or turn is None or not any(isinstance(p, Video) for p in turn.parts)
                or any(p.type != "input_text" for p in item.content)):
            return False
        conn.append_text("".join(p.text for p in item.content))
        conn.commit_text()
        return True

    def decode_item(self, item: Item, previous_item_id: str | None, event_id: str | None) -> bool:
        """An item with input_image parts: True when it waits for them (it joins from _images_decoded)."""
        parts = [(i, p) for i, p in enumerate(item.content or []) if p.type == "input_image"]
        if not parts:
            return False
        serving = self.conn.serving
        limit = serving.options.limit_mm_per_prompt.get(IMAGE, 8)
        num_images = sum(1 for m in self.media_in_order() if not isinstance(m, Video)) + len(parts)
        if num_images > limit:
            raise RealtimeError("too_many_media", f"the conversation would hold {num_images} pictures; at most "
                                f"{limit} (--limit-mm-per-prompt)", "item.content")
        item.id = item.id or new_id("item")
        policy, mm_inputs = serving.options.media, serving.mm_inputs

        def decode():
            return [mm_inputs.item(IMAGE, load_image(p.image_url, policy, param=f"item.content[{i}].image_url"))
                    for i, p in parts]

        self._decoding[item.id] = (item, previous_item_id, event_id)
        self._num_holds += 1
        self.link.decode_images(item.id, decode)
        return True

    def _images_decoded(self, event: ImagesDecoded) -> None:
        item, previous_item_id, event_id = self._decoding.pop(event.item_id)
        try:
            if event.code is not None:
                self.conn.emit(error_event(RealtimeError(event.code, event.message, event.param), event_id))
                return
            for part in item.content:
                if part.type == "input_image":
                    part.image_url = None  # processed: the bytes are not kept (as input_audio once heard)
            self.media[item.id] = list(event.items)
            self.conn.add_client_item(item, previous_item_id)
        finally:
            self._release()

    def reopens(self) -> bool:
        """The conversation changed under a turn holding video: open it again over the new conversation, its
        text and video appended again (a full prefill: rare, e.g. an item inserted while streaming)."""
        conn, turn = self.conn, self.conn.turn
        if turn is None or not any(isinstance(p, Video) for p in turn.parts):
            return False
        parts = turn.parts
        conn.drop_input()
        conn.open_input("")
        new = conn.turn
        for part in parts:
            if isinstance(part, str):
                conn.append_text(part)
            elif part.pieces:
                self.before_text(new)  # a video after a video: the first ends
                conn.send(new, new.encoder.flush())
                for piece in part.pieces:
                    ids, items = new.context.add_piece(piece)
                    conn.engine.append(new.request_id, ids, items)
                    new.num_sent += len(ids)
                new.parts.append(new.context.segments[-1])
                if part.closed:
                    self.before_text(new)
        return True
