"""Speech from espeak-ng (the Debian package), at training and test time only: never at run time.

espeak-ng writes a 22,050 Hz WAV to stdout; soundfile reads it and soxr resamples it to 16 kHz,
the rate Whisper's front end expects. Leading and trailing silence beyond 50 ms is trimmed, so
the recipe's own random offset decides where speech starts.
"""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import soundfile
import soxr

from rill.tiny_speech.voices import Voice

SAMPLE_RATE = 16_000
ESPEAK = "espeak-ng"
SYNTH_TIMEOUT_S = 20
_SILENCE = 1e-3  # |amplitude| below this counts as silence when trimming
_KEEP_S = 0.05


class SynthError(RuntimeError):
    """espeak-ng is missing or failed."""


def espeak_available() -> bool:
    return shutil.which(ESPEAK) is not None


def synthesize(text: str, voice: Voice) -> np.ndarray:
    """`text` spoken by `voice`: float32 mono at 16 kHz, silence trimmed."""
    command = [ESPEAK, *voice.args(), "--stdout", text]
    try:
        done = subprocess.run(command, capture_output=True, timeout=SYNTH_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SynthError(f"espeak-ng failed for {text!r} with {voice.name}: {exc}") from exc
    samples, rate = soundfile.read(io.BytesIO(done.stdout), dtype="float32", always_2d=True)
    audio = soxr.resample(samples.mean(axis=1), rate, SAMPLE_RATE).astype(np.float32)
    return trim_silence(audio)


def trim_silence(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > _SILENCE)
    if len(loud) == 0:
        return audio[:0]
    keep = int(_KEEP_S * SAMPLE_RATE)
    return audio[max(0, loud[0] - keep) : loud[-1] + keep]


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)


def from_pcm16(pcm: np.ndarray) -> np.ndarray:
    return pcm.astype(np.float32) / 32768.0
