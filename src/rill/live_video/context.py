"""A live session's context as segments: text ids, and videos made of pieces. What the engine has is
`prompt()`; when more frames than the window allows are in it, `trim()` leaves the oldest out and
`prompt()` is then the shorter context a rebase prefills (rill.engine.live_sessions).

Sans-IO and model-agnostic: the framing ids come from rill.live_video.framing. A video that loses all
its pieces to the window goes whole, its open and close ids with it; text always stays (it is small,
and the session's payload cap bounds it), and so do pictures (`Fixed`: ids with their items).

`from_placeholders` builds a context from a rendered prompt whose images and videos are still one
placeholder each (a conversation rendered by its chat template, rill.transports.realtime.video).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rill.live_video.framing import Piece, VideoFraming, placed


@dataclass
class Video:
    pieces: list[Piece] = field(default_factory=list)
    closed: bool = False

    @property
    def num_frames(self) -> int:
        return sum(p.num_frames for p in self.pieces)


@dataclass
class Fixed:
    """Ids that carry items (a picture's placeholders), the items placed within them."""

    ids: list[int]
    items: list


@dataclass
class LiveContext:
    framing: VideoFraming | None  # None: a model that reads pictures only (no video)
    segments: list[list[int] | Video | Fixed] = field(default_factory=list)  # text ids, a video, a picture

    @classmethod
    def from_placeholders(cls, framing: VideoFraming, ids: list[int], media: list, image_pad: int | None = None,
                          ) -> LiveContext:
        """ids with one placeholder per image (image_pad) and per video (framing.pad_id, between its open and
        close ids); media: for each, in order, its MultiModalItem (an image) or its Video (pieces)."""
        context, queue, text = cls(framing), list(media), []
        video_pad = framing.pad_id if framing is not None else None
        i, n_open, n_close = 0, len(framing.open_ids) if framing else 0, len(framing.close_ids) if framing else 0
        while i < len(ids):
            token = ids[i]
            if token == video_pad and queue and isinstance(queue[0], Video):
                context.add_text(text[:len(text) - n_open])
                context.segments.append(queue.pop(0))
                text, i = [], i + 1 + n_close
            elif token == image_pad and queue and not isinstance(queue[0], Video):
                context.add_text(text)
                item = queue.pop(0)
                context.segments.append(Fixed([image_pad] * item.num_tokens, [item.at(0)]))
                text, i = [], i + 1
            else:
                text.append(token)
                i += 1
        context.add_text(text)
        if queue:
            raise ValueError(f"{len(queue)} images or videos have no placeholder in the prompt")
        return context

    # -- building ------------------------------------------------------------------------------------

    def add_text(self, ids: list[int]) -> None:
        if ids:
            self.segments.append(list(ids))

    @property
    def open_video(self) -> Video | None:
        last = self.segments[-1] if self.segments else None
        return last if isinstance(last, Video) and not last.closed else None

    def add_piece(self, piece: Piece) -> tuple[list[int], list]:
        """Append a piece; the ids and placed items to append to the engine (offsets within the ids)."""
        video = self.open_video
        opening = video is None
        if opening:
            video = Video()
            self.segments.append(video)
        video.pieces.append(piece)
        head = list(self.framing.open_ids) if opening else []
        ids = head + [self.framing.pad_id] * piece.num_tokens
        return ids, [placed(piece, len(head), not opening)]

    def close_video(self) -> list[int]:
        """Text follows: the open video (if any) ends; the ids that end it."""
        video = self.open_video
        if video is None:
            return []
        video.closed = True
        return list(self.framing.close_ids)

    # -- the window ----------------------------------------------------------------------------------

    @property
    def pieces(self) -> list[Piece]:
        return [p for s in self.segments if isinstance(s, Video) for p in s.pieces]

    @property
    def num_frames(self) -> int:
        return sum(s.num_frames for s in self.segments if isinstance(s, Video))

    def num_to_trim(self, max_frames: int, max_seconds: float | None = None, max_tokens: int | None = None) -> int:
        """Frames (whole pieces, oldest first) past the window: more than max_frames, or (with timestamps)
        more than max_seconds older than the newest frame, or (with max_tokens) as many as bring a context
        longer than max_tokens down to three quarters of it. The newest piece always stays."""
        pieces = self.pieces
        extra = self.num_frames - max_frames
        newest = next((p.first_timestamp_s for p in reversed(pieces) if p.first_timestamp_s is not None), None)
        tokens = self.num_tokens
        target = max_tokens * 3 // 4 if max_tokens is not None and tokens > max_tokens else None
        count = 0
        for piece in pieces[:-1]:
            too_old = (max_seconds is not None and newest is not None and piece.first_timestamp_s is not None
                       and newest - piece.first_timestamp_s > max_seconds)
            too_long = target is not None and tokens > target
            if count >= extra and not too_old and not too_long:
                break
            count += piece.num_frames
            tokens -= piece.num_tokens
        return count

    def trim(self, num_frames: int) -> int:
        """Leave out the oldest pieces holding at least num_frames frames; return the frames left out."""
        removed = 0
        for video in [s for s in self.segments if isinstance(s, Video)]:
            while video.pieces and removed < num_frames:
                removed += video.pieces.pop(0).num_frames
        self.segments = [s for s in self.segments if not (isinstance(s, Video) and not s.pieces)]
        return removed

    # -- the prompt ----------------------------------------------------------------------------------

    def prompt(self) -> tuple[list[int], list]:
        """The context's ids and its placed items (absolute offsets)."""
        ids: list[int] = []
        items = []
        for segment in self.segments:
            if isinstance(segment, Fixed):
                items += [item.at(len(ids) + item.offset) for item in segment.items]
                ids += segment.ids
                continue
            if not isinstance(segment, Video):
                ids += segment
                continue
            ids += self.framing.open_ids
            for i, piece in enumerate(segment.pieces):
                items.append(placed(piece, len(ids), i > 0))
                ids += [self.framing.pad_id] * piece.num_tokens
            if segment.closed:
                ids += self.framing.close_ids
        return ids, items

    @property
    def num_tokens(self) -> int:
        return sum(len(s.ids) if isinstance(s, Fixed) else len(s) if not isinstance(s, Video) else (
            len(self.framing.open_ids) + sum(p.num_tokens for p in s.pieces)
            + (len(self.framing.close_ids) if s.closed else 0)) for s in self.segments)
