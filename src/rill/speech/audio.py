"""Audio in: encoded files and raw PCM16 to the 16 kHz mono float32 that Whisper-family models hear, or
to the rate another model hears (Kyutai STT: 24 kHz), resampled once from the file's own rate.

Decoding is libsndfile's (through `soundfile`: WAV, FLAC, OGG/Vorbis/Opus, and MP3 where the linked
libsndfile has it, 1.1 on), resampling is libsoxr's (through `soxr`). Nothing here parses a container
or filters a signal by hand.

Every input this module refuses raises `AudioError`, a `ValidationError` that the HTTP edge answers as
a 400 `invalid_request_error` with code `invalid_audio` and param `file`.

Length cap: a few kilobytes of FLAC or Vorbis can hold hours of silence, so decoding stops at
`max_seconds` of audio (default `DEFAULT_MAX_SECONDS`, 30 minutes) and says so instead of growing
without bound. The header's rate and channels bound the decoder's work too: rates above
`MAX_SAMPLE_RATE`, more than `MAX_CHANNELS` channels, and more than `MAX_DECODED_SAMPLES` samples
(frames x channels: duration x rate x channels) are refused before a sample is decoded. A 184 KiB
FLAC of 120 s of 192 kHz 8-channel silence decoded to 737 MB of float32 before this bound; now it
is a 400.

`load_audio` decodes a file in pieces of `PIECE_FRAMES` frames, each mixed to mono and resampled to
16 kHz (or its `rate`) as it is read (soxr's streaming resampler gives the same samples as one call
over the whole), so what it holds is the result (at most 115 MB at 30 minutes of 16 kHz) plus one
piece, whatever the file's rate and channels. `decode_audio` keeps the file's own rate and channels for callers that
want them, within the same caps.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from rill.errors import ValidationError

SAMPLE_RATE = 16_000
DEFAULT_MAX_SECONDS = 1800.0
MAX_SAMPLE_RATE = 192_000  # the highest rate studio audio uses; speech needs 16 kHz
MAX_CHANNELS = 8  # 7.1 surround
MAX_DECODED_SAMPLES = 1800 * 48_000 * 2  # frames x channels of one file: 30 minutes of 48 kHz stereo
PIECE_FRAMES = 1 << 16  # frames load_audio decodes at a time: 2 MiB of float32 at 8 channels
_PCM16_SCALE = 32768.0  # int16 full scale: -32768 maps to -1.0, 32767 to just under 1.0


class AudioError(ValidationError):
    """Audio that cannot be used: empty, undecodable, too long, non-finite, or of the wrong shape or type."""

    def __init__(self, message: str, param: str | None = "file"):
        super().__init__(message, param=param, code="invalid_audio")


def decode_audio(data: bytes, *, max_seconds: float = DEFAULT_MAX_SECONDS) -> tuple[np.ndarray, int]:
    """Decode an encoded file's bytes into float32 samples of shape (frames, channels) at its own rate.

    Stops after `max_seconds` of audio: a longer file is an AudioError, whatever its size in bytes.
    """
    if not data:
        raise AudioError("the audio file is empty")
    with _open(data) as sound:
        _check_header(sound, max_seconds)
        max_frames = _max_frames(max_seconds, sound.samplerate)
        max_read = min(max_frames, MAX_DECODED_SAMPLES // sound.channels)  # a header may underestimate
        # One frame past the cap tells "exactly at the limit" from "over it" without a second read.
        samples = _read(sound, max_read + 1)
        sample_rate = sound.samplerate
    if len(samples) > max_read:
        raise _too_long(max_seconds) if max_read == max_frames else _too_many_samples()
    _check_samples(samples)
    return samples, sample_rate


def decode_mono(data: bytes, rate: int = SAMPLE_RATE, *,
                max_seconds: float = DEFAULT_MAX_SECONDS) -> tuple[np.ndarray, int]:
    """Decode an encoded file's bytes to mono float32 at `rate` in pieces; returns (samples, the file's rate).

    Each piece of PIECE_FRAMES frames is mixed to mono and resampled straight from the file's rate to
    `rate` (one soxr pass: a model that hears at 24 kHz gets a 44.1 kHz file's 8-12 kHz band, which a
    stop at 16 kHz would drop) before the next is read, so the file's full-rate, many-channel samples
    are never held at once (see the module's docstring).
    """
    _check_rate(rate)
    if not data:
        raise AudioError("the audio file is empty")
    with _open(data) as sound:
        _check_header(sound, max_seconds)
        pieces = list(_mono_pieces(sound, max_seconds, rate))
        sample_rate = sound.samplerate
    mono = np.concatenate(pieces)
    if mono.size == 0:  # e.g. one frame at 48 kHz is a third of a sample at 16 kHz
        raise AudioError(f"the audio is shorter than one sample at {rate} Hz")
    return mono, sample_rate


def _mono_pieces(sound: sf.SoundFile, max_seconds: float, rate: int):
    """Mono float32 arrays at `rate`, one per piece read; the last is read short (or empty) at the end.
    The caps are checked again as pieces arrive: some headers only estimate their frame count."""
    resampler = None
    if sound.samplerate != rate:
        resampler = soxr.ResampleStream(sound.samplerate, rate, 1, dtype="float32")
    max_frames = min(_max_frames(max_seconds, sound.samplerate), MAX_DECODED_SAMPLES // sound.channels)
    num_frames = 0
    while True:
        piece = _read(sound, PIECE_FRAMES)
        num_frames += len(piece)
        if num_frames > max_frames:
            raise _too_long(max_seconds) if num_frames > _max_frames(max_seconds, sound.samplerate) else \
                _too_many_samples()
        last = len(piece) < PIECE_FRAMES
        if num_frames == 0:
            raise AudioError("the audio has no samples")
        if not np.isfinite(piece).all():
            raise AudioError("the audio contains NaN or infinite samples")
        mono = np.ascontiguousarray(piece.mean(axis=1) if sound.channels > 1 else piece[:, 0], dtype=np.float32)
        yield mono if resampler is None else resampler.resample_chunk(mono, last=last)
        if last:
            return


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Raw little-endian signed 16-bit mono PCM (a stream's chunks) -> float32 in [-1, 1)."""
    if not data:
        raise AudioError("the PCM16 audio is empty")
    if len(data) % 2:
        raise AudioError(f"PCM16 audio has 2 bytes a sample, got {len(data)} bytes (an odd count)")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / _PCM16_SCALE


def to_mono_16k(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mix (frames,) or (frames, channels) float samples to mono and resample them to 16 kHz with soxr.

    Returns a C-contiguous 1-D float32 array.
    """
    return to_mono(samples, sample_rate, SAMPLE_RATE)


def to_mono(samples: np.ndarray, sample_rate: int, rate: int) -> np.ndarray:
    """`to_mono_16k` to any `rate`: mono, resampled once from `sample_rate` with soxr."""
    _check_rate(sample_rate)
    _check_rate(rate)
    if not isinstance(samples, np.ndarray) or samples.dtype.kind != "f":
        raise AudioError(f"audio samples must be a float numpy array, got {_describe(samples)}")
    _check_samples(samples)
    mono = samples if samples.ndim == 1 else samples.mean(axis=1)
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if sample_rate != rate:
        mono = soxr.resample(mono, sample_rate, rate)
        if mono.size == 0:  # e.g. one frame at 48 kHz is a third of a sample at 16 kHz
            raise AudioError(f"the audio is shorter than one sample at {rate} Hz")
    return np.ascontiguousarray(mono, dtype=np.float32)


def load_audio(
    source: str | os.PathLike | bytes | np.ndarray,
    sample_rate: int | None = None,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    rate: int = SAMPLE_RATE,
) -> np.ndarray:
    """Anything a user may hand over -> mono float32 at `rate` (16 kHz unless the model hears at another).

    `source` is a path, an encoded file's bytes, or a numpy array of float samples (or int16, scaled by
    1/32768) shaped (frames,) or (frames, channels). An array's rate is `sample_rate`, 16 kHz when None
    (an array carries no rate, so a wrong one cannot be detected: pass it). For a file the header gives
    the rate; a `sample_rate` that disagrees with it is an error rather than silently ignored.
    """
    if isinstance(source, np.ndarray):
        return _load_array(source, SAMPLE_RATE if sample_rate is None else sample_rate, max_seconds, rate)
    if isinstance(source, (str, os.PathLike)):
        source = Path(source).read_bytes()
    if isinstance(source, (bytes, bytearray, memoryview)):
        mono, file_rate = decode_mono(bytes(source), rate, max_seconds=max_seconds)
        if sample_rate is not None and sample_rate != file_rate:
            raise AudioError(
                f"sample_rate={sample_rate} was given but the file says {file_rate} Hz; leave sample_rate unset "
                "for files", param="sample_rate")
        return mono
    raise AudioError(f"audio must be a path, the bytes of an audio file or a numpy array, got {_describe(source)}")


def _load_array(samples: np.ndarray, sample_rate: int, max_seconds: float, rate: int) -> np.ndarray:
    if samples.dtype == np.int16:
        samples = samples.astype(np.float32) / _PCM16_SCALE
    elif samples.dtype.kind != "f":
        raise AudioError(f"audio arrays must be float (any width) or int16, got {_describe(samples)}")
    _check_rate(sample_rate)
    _check_samples(samples)
    if len(samples) > _max_frames(max_seconds, sample_rate):
        raise _too_long(max_seconds)
    return to_mono(samples, sample_rate, rate)


def _open(data: bytes) -> sf.SoundFile:
    try:
        return sf.SoundFile(io.BytesIO(data))
    except sf.LibsndfileError as exc:
        raise AudioError(f"could not decode the audio file: {exc.error_string}") from None
    except (sf.SoundFileError, RuntimeError, TypeError, ValueError) as exc:  # soundfile's own header checks
        raise AudioError(f"could not decode the audio file: {exc}") from None


def _read(sound: sf.SoundFile, max_frames: int) -> np.ndarray:
    """At most `max_frames` frames as float32 (frames, channels); a stream that breaks off midway is an error."""
    try:
        return sound.read(frames=max_frames, dtype="float32", always_2d=True)
    except sf.LibsndfileError as exc:
        raise AudioError(f"could not decode the audio file: {exc.error_string}") from None
    except (sf.SoundFileError, RuntimeError) as exc:
        raise AudioError(f"could not decode the audio file: {exc}") from None


def _check_header(sound: sf.SoundFile, max_seconds: float) -> None:
    """Refuse what the header alone shows to be unusable, before any sample is decoded."""
    if not 0 < sound.samplerate <= MAX_SAMPLE_RATE:
        raise AudioError(f"the audio file's sample rate {sound.samplerate} Hz is outside 1..{MAX_SAMPLE_RATE} Hz")
    if not 0 < sound.channels <= MAX_CHANNELS:
        raise AudioError(f"the audio file has {sound.channels} channels; at most {MAX_CHANNELS} are accepted")
    # frames is exact for PCM containers and an estimate for some compressed ones; the capped read decides.
    if sound.frames > _max_frames(max_seconds, sound.samplerate):
        raise _too_long(max_seconds)
    if sound.frames * sound.channels > MAX_DECODED_SAMPLES:
        raise AudioError(f"the audio holds {sound.frames} frames of {sound.channels} channels at "
                         f"{sound.samplerate} Hz: {sound.frames * sound.channels} samples, past the limit of "
                         f"{MAX_DECODED_SAMPLES} (30 minutes of 48 kHz stereo)")


def _check_samples(samples: np.ndarray) -> None:
    if samples.ndim not in (1, 2):
        raise AudioError(f"audio must be shaped (frames,) or (frames, channels), got shape {samples.shape}")
    if samples.size == 0:
        raise AudioError("the audio has no samples")
    if samples.ndim == 2 and samples.shape[1] > MAX_CHANNELS:
        raise AudioError(
            f"audio shaped {samples.shape} has {samples.shape[1]} channels (at most {MAX_CHANNELS}); "
            "arrays are (frames, channels)")
    if not np.isfinite(samples).all():
        raise AudioError("the audio contains NaN or infinite samples")


def _check_rate(sample_rate: object) -> None:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise AudioError(f"sample_rate must be an integer number of Hz, got {sample_rate!r}", param="sample_rate")
    if not 0 < sample_rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"sample_rate must be in 1..{MAX_SAMPLE_RATE} Hz, got {sample_rate}", param="sample_rate")


def _max_frames(max_seconds: float, sample_rate: int) -> int:
    if not 0 < max_seconds < math.inf:
        raise ValueError(f"max_seconds must be a positive finite number of seconds, got {max_seconds!r}")
    return int(max_seconds * sample_rate)


def _too_long(max_seconds: float) -> AudioError:
    return AudioError(f"the audio is longer than the limit of {max_seconds:g} s (max_seconds)")


def _too_many_samples() -> AudioError:
    return AudioError(f"the audio holds more than {MAX_DECODED_SAMPLES} samples (frames x channels; 30 minutes "
                      "of 48 kHz stereo)")


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__name__
