"""InputChunk: one piece of a session's input, as every streaming-input transport carries it.

    {"sequence_id": 3, "modality": "text", "payload": "the next words", "end_of_input": false}

`payload` is text for `text`, a list of token ids for `tokens`, and base64 for `audio`: PCM16
little-endian mono at `sample_rate` Hz (default 16000), transcribed by the served speech model as it
arrives (rill.openai.streaming_audio). Camera frames (rill.openai.streaming_video): `image` is one
frame, base64 JPEG/PNG/WebP (or a data:image URL) with an optional `timestamp_ms`; `video` is base64
bytes of a WebM or fragmented MP4 stream (a MediaRecorder blob), decoded as it arrives. Sizes are
counted in bytes: UTF-8 for text, 4 per token id, the decoded bytes for audio, image and video.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Annotated

import msgspec

from rill.sessions.errors import PayloadTooLarge, UnsupportedModality

BYTES_PER_TOKEN_ID = 4


class Modality(str, enum.Enum):
    TEXT = "text"
    TOKENS = "tokens"
    AUDIO = "audio"
    IMAGE = "image"  # a camera frame
    VIDEO = "video"  # a piece of an encoded video stream


MEDIA_MODALITIES = (Modality.AUDIO, Modality.IMAGE, Modality.VIDEO)  # base64 payloads
FRAME_MODALITIES = (Modality.IMAGE, Modality.VIDEO)  # frames leave the context: no per-session byte cap


class InputChunk(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # None only where the transport numbers chunks itself (Mode A lines take the next id).
    sequence_id: Annotated[int, msgspec.Meta(ge=0)] | None = None
    modality: Modality = Modality.TEXT
    payload: str | list[int] = ""
    end_of_input: bool = False
    sample_rate: Annotated[int, msgspec.Meta(ge=8000, le=48000)] | None = None  # audio only; None: 16000
    timestamp_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None  # image only: when the camera took it

    @property
    def num_payload_bytes(self) -> int:
        if isinstance(self.payload, list):
            return BYTES_PER_TOKEN_ID * len(self.payload)
        if self.modality in MEDIA_MODALITIES:
            return len(self.payload) * 3 // 4  # base64
        return len(self.payload.encode())

    @property
    def digest(self) -> bytes:
        """What a repeated sequence id is compared by: same digest, same chunk."""
        return hashlib.blake2b(msgspec.json.encode(self), digest_size=16).digest()


def check_chunk(chunk: InputChunk, max_chunk_bytes: int) -> None:
    """What a chunk must be on its own, before it touches a session."""
    if chunk.sample_rate is not None and chunk.modality is not Modality.AUDIO:
        raise UnsupportedModality("sample_rate is for audio chunks", param="sample_rate", code="invalid_value")
    if chunk.timestamp_ms is not None and chunk.modality is not Modality.IMAGE:
        raise UnsupportedModality("timestamp_ms is for image chunks", param="timestamp_ms", code="invalid_value")
    if (chunk.modality is Modality.TOKENS) != isinstance(chunk.payload, list):
        want = "a list of token ids" if chunk.modality is Modality.TOKENS else "a string (base64 for audio, image, video)"
        raise UnsupportedModality(f"modality {chunk.modality.value!r} needs {want} as payload", param="payload",
                                  code="invalid_value")
    if chunk.num_payload_bytes > max_chunk_bytes:
        raise PayloadTooLarge(f"the chunk's payload is {chunk.num_payload_bytes} bytes; max_chunk_bytes is "
                              f"{max_chunk_bytes}", param="payload", code="chunk_too_large")
