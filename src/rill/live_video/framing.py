"""How a frame stream becomes the model's video input, a piece at a time.

A Qwen2-VL-family model reads a video as temporal patches of `temporal_patch_size` (2) frames; its
vision tower attends within each frame (and its windows), so the embeddings of a video encoded a
patch at a time equal those of the whole video encoded at once, and so do the processor's pixels
(each frame is resized and normalized on its own; an odd last frame is repeated). A live stream is
therefore one video that grows by a *piece* (one temporal patch) whenever two frames have arrived:
`open_ids` (`<|vision_start|>`) before its first piece, `<|video_pad|>` once per merged token of each
piece, `close_ids` (`<|vision_end|>`) when text follows. The pieces are items that `continue` one
another (rill.multimodal.mrope lays them out as one video), so the prompt a live stream builds is
token for token the prompt of the whole clip sent at once, and so is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
from PIL import Image

from rill.errors import ValidationError
from rill.multimodal.inputs import VIDEO, MultiModalItem
from rill.multimodal.qwen2_vl_inputs import VideoClip

_BEFORE, _AFTER = "\ue000rill:before-video\ue000", "\ue000rill:after-video\ue000"


@dataclass(frozen=True)
class VideoFraming:
    """The ids around a video's placeholders, as the model's chat template writes a video part."""

    open_ids: tuple[int, ...]
    pad_id: int
    close_ids: tuple[int, ...]


def video_framing(tokenizer, mm_inputs) -> VideoFraming:
    """Rendered from the chat template: a user message [text, video, text] split at the two texts."""
    if mm_inputs is None or not hasattr(mm_inputs, "video_cfg"):
        raise ValidationError("live video needs a model that reads video (Qwen2-VL or Qwen2.5-VL); this one "
                              + ("reads text only" if mm_inputs is None else "reads images only"),
                              param="modality", code="unsupported_modality")
    pad_id = mm_inputs.placeholder(VIDEO)
    content = [{"type": "text", "text": _BEFORE}, {"type": "video"}, {"type": "text", "text": _AFTER}]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": content}])
    part = rendered.split(_BEFORE, 1)[-1].split(_AFTER, 1)[0]
    ids = tokenizer.encode(part, add_special_tokens=False)
    if ids.count(pad_id) != 1:
        raise ValidationError("this model's chat template writes no video placeholder", param="modality",
                              code="unsupported_modality")
    at = ids.index(pad_id)
    return VideoFraming(tuple(ids[:at]), pad_id, tuple(ids[at + 1:]))


class Piece(msgspec.Struct, frozen=True):
    """One temporal patch of a live video: its placeholder ids and its item (offset 0 within them)."""

    item: MultiModalItem
    num_frames: int  # frames it holds (1 for an odd last frame, repeated by the processor)
    first_timestamp_s: float | None  # its first frame's, when the client gave timestamps

    @property
    def num_tokens(self) -> int:
        return self.item.num_tokens


class PieceMaker:
    """Frames -> pieces with the model's video processor (blocking: run it in a worker thread)."""

    def __init__(self, mm_inputs, fps: float):
        self.mm_inputs = mm_inputs
        self.fps = fps  # the stream's nominal rate: Qwen2.5-VL's M-RoPE time scale
        self.frames_per_piece = mm_inputs.video_cfg.temporal_patch_size

    def piece(self, frames: list[np.ndarray], size: tuple[int, int], first_timestamp_s: float | None = None) -> Piece:
        """frames: 1..frames_per_piece RGB uint8 arrays [H, W, 3]; those not of the video's `size` (height,
        width: its first frame's) are resized to it, as one video's frames must share a size."""
        frames = [f if f.shape[:2] == size else _resized(f, size) for f in frames]
        item = self.mm_inputs.item(VIDEO, VideoClip(np.stack(frames), self.fps))
        return Piece(item, len(frames), first_timestamp_s)


def _resized(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    height, width = size
    return np.asarray(Image.fromarray(frame).resize((width, height), resample=Image.Resampling.BICUBIC))


def placed(piece: Piece, offset: int, continues: bool) -> MultiModalItem:
    """The piece's item at a prompt offset, continuing the piece before it or starting a video."""
    return msgspec.structs.replace(piece.item, offset=offset, continues=continues)
