"""The delayed text stream: one token per 80 ms frame, each word's tokens placed `delay` after it ends.

The decoder runs one position per frame of the padded audio (mistral-common's streaming request: `n_left`
frames of silence, the audio, then silence to a whole frame and `delay + 1 + 10` frames). Position p has
heard frames 0..p and predicts the token fed at p + 1. The prompt is BOS and `n_left + delay` streaming
pads, so the token at index q (q past the prompt) is predicted at position q - 1, having heard the
audio up to frame q - 1 - n_left. A word group ending in frame e therefore starts at index
e + delay + n_left + 1; its tokens follow one a frame, and a group whose slot is taken waits for the
next free frame. Every other index is a streaming pad: silence and words still being said write nothing.
"""

from __future__ import annotations

from rill.tiny_causal.vocab import BOS, PAD, Vocab

FRAME = 1280  # samples per 80 ms frame at 16 kHz
RIGHT_PAD_FRAMES = 10  # mistral-common's OFFLINE_STREAMING_BUFFER_TOKENS, as rill's VoxtralStream pads


def num_frames(num_samples: int, delay: int, n_left: int) -> int:
    """Frames of the padded audio, as VoxtralStream.end() pads a clip."""
    return n_left + -(-num_samples // FRAME) + delay + 1 + RIGHT_PAD_FRAMES


def token_stream(vocab: Vocab, groups: list[str], ends: list[int], num_samples: int, delay: int,
                 n_left: int) -> list[int]:
    """The whole text stream (prompt included), one token per frame of the padded audio. A stream longer
    than num_frames() does not fit: a live stream stops at the padding's end, so training skips it."""
    stream = [BOS] + [PAD] * (num_frames(num_samples, delay, n_left) - 1)
    q = 0
    for i, (group, end) in enumerate(zip(groups, ends)):
        q = max(q, (max(end, 1) - 1) // FRAME + delay + n_left + 1)
        for token in vocab.encode(" " + group):
            if q >= len(stream):
                stream.append(PAD)
            stream[q] = token
            q += 1
    return stream


def first_index(ends_sample: int, delay: int, n_left: int) -> int:
    """The stream index of the first token of a group ending at `ends_sample` (tests check this)."""
    return (max(ends_sample, 1) - 1) // FRAME + delay + n_left + 1
