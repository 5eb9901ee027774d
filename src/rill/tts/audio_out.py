"""Frames to bytes for the wire: OpenAI's `response_format`s, each produced in pieces as audio is made.

    enc = open_encoder("mp3", 24_000)
    for frames in audio:                 # float32 mono in [-1, 1]
        send(enc.write(frames))          # bytes ready so far (may be b"" while the encoder buffers)
    send(enc.close())                    # the rest

pcm   raw 16-bit little-endian mono at 24 kHz, as OpenAI sends it
wav   a RIFF header from libsndfile with its sizes set to 0xFFFFFFFF (unknown length: the convention
      ffmpeg and OpenAI's streamed WAV use), then 16-bit PCM
mp3, opus (Ogg)   libsndfile (soundfile) writing into memory; what it writes is sent as it comes.
flac  libsndfile too, but sent whole at close: FLAC's header carries the total length, which libsndfile
      fills in by seeking back at the end, and libsndfile's own reader (soundfile.read) refuses a FLAC
      whose header says "unknown". The one format that does not stream; say `pcm` or `wav` to stream.
aac   PyAV's (FFmpeg's) AAC encoder in an ADTS stream, which needs no header and is streamable.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's list, its order
CONTENT_TYPES = {
    "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav",
    "pcm": "audio/pcm",
}
_SNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
OPUS_RATES = (8_000, 12_000, 16_000, 24_000, 48_000)


def to_int16(frames: np.ndarray) -> np.ndarray:
    return (np.clip(np.asarray(frames, dtype=np.float32), -1.0, 1.0) * 32767.0).astype("<i2")


class PcmEncoder:
    def __init__(self, rate: int):
        self.rate = rate

    def write(self, frames: np.ndarray) -> bytes:
        return to_int16(frames).tobytes()

    def close(self) -> bytes:
        return b""


class WavEncoder(PcmEncoder):
    def __init__(self, rate: int):
        super().__init__(rate)
        self._header = _streaming_wav_header(rate)

    def write(self, frames: np.ndarray) -> bytes:
        header, self._header = self._header, b""
        return header + super().write(frames)

    def close(self) -> bytes:
        header, self._header = self._header, b""
        return header  # an empty clip is still a WAV file


def _streaming_wav_header(rate: int) -> bytes:
    """libsndfile's header for 16-bit mono at `rate`, its RIFF and data sizes set to 'unknown'."""
    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", samplerate=rate, channels=1, format="WAV", subtype="PCM_16") as f:
        f.write(np.zeros(0, dtype=np.int16))
    header = bytearray(buffer.getvalue())
    data = header.find(b"data")
    if header[:4] != b"RIFF" or data < 0:
        raise RuntimeError("libsndfile wrote an unexpected WAV header")
    header[4:8] = struct.pack("<I", 0xFFFFFFFF)
    header[data + 4:data + 8] = struct.pack("<I", 0xFFFFFFFF)
    return bytes(header[:data + 8])


class SndfileEncoder:
    """libsndfile writing into memory; each call returns the bytes past those already returned."""

    def __init__(self, fmt: str, rate: int):
        container, subtype = _SNDFILE[fmt]
        self.rate = rate
        self._streams = fmt != "flac"
        self._buffer = io.BytesIO()
        self._sent = 0
        self._file = soundfile.SoundFile(self._buffer, "w", samplerate=rate, channels=1, format=container,
                                         subtype=subtype)

    def write(self, frames: np.ndarray) -> bytes:
        self._file.write(np.asarray(frames, dtype=np.float32))
        return self._new_bytes() if self._streams else b""

    def close(self) -> bytes:
        self._file.close()
        return self._new_bytes()

    def _new_bytes(self) -> bytes:
        data = self._buffer.getbuffer()
        new = bytes(data[self._sent:])
        self._sent = len(data)
        del data  # release the view so the buffer can grow again
        return new


class AacEncoder:
    """FFmpeg's AAC (PyAV) in ADTS frames of 1,024 samples."""

    def __init__(self, rate: int):
        import av  # PyAV: a main dependency (video in), imported only for this format

        self.rate = rate
        self._buffer = io.BytesIO()
        self._sent = 0
        self._container = av.open(self._buffer, "w", format="adts")
        self._stream = self._container.add_stream("aac", rate=rate, layout="mono")
        self._av = av
        self._pts = 0

    def write(self, frames: np.ndarray) -> bytes:
        samples = to_int16(frames)
        if samples.size:
            frame = self._av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.rate, self._pts
            self._pts += samples.size
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._new_bytes()

    def close(self) -> bytes:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._new_bytes()

    def _new_bytes(self) -> bytes:
        data = self._buffer.getvalue()
        new, self._sent = data[self._sent:], len(data)
        return new


def open_encoder(fmt: str, rate: int = 24_000):
    """An encoder for OpenAI's `response_format` `fmt` at `rate` Hz (mono); ValueError for others."""
    if fmt == "pcm":
        return PcmEncoder(rate)
    if fmt == "wav":
        return WavEncoder(rate)
    if fmt in _SNDFILE:
        if fmt == "opus" and rate not in OPUS_RATES:
            raise ValueError(f"opus takes {OPUS_RATES} Hz, not {rate}")
        return SndfileEncoder(fmt, rate)
    if fmt == "aac":
        return AacEncoder(rate)
    raise ValueError(f"response_format must be one of {', '.join(FORMATS)}; got {fmt!r}")


def encode(frames: np.ndarray, fmt: str, rate: int = 24_000) -> bytes:
    """A whole clip in one format (a WAV with its real sizes: its length is known)."""
    if fmt == "wav":
        buffer = io.BytesIO()
        soundfile.write(buffer, to_int16(frames), rate, format="WAV", subtype="PCM_16")
        return buffer.getvalue()
    encoder = open_encoder(fmt, rate)
    return encoder.write(frames) + encoder.close()
