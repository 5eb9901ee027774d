"""Voice activity: where speech starts, pauses and stops in a live 16 kHz stream (server_vad).

The frame classifier is WebRTC's VAD (the `webrtcvad` module, from PyPI's `webrtcvad-wheels`): a
small Gaussian-mixture model in C that labels each 30 ms frame speech or not. OpenAI's
`turn_detection` settings map onto it so:

- `threshold` (0..1, default 0.5) picks WebRTC's aggressiveness (0..3: `int(4 * threshold)`, at most
  3) and is the level a smoothed speech probability must reach: the frames' labels averaged with
  weight `SMOOTHING` (two speech frames in a row reach 0.64; two silent ones after speech 0.36), so a
  lone click does not start speech and a lone dropout does not end it. Frames quieter than
  `SILENCE_DBFS` are silence whatever WebRTC says.
- `prefix_padding_ms` (default 300): audio kept before the detected onset (`audio_start_ms`).
- `silence_duration_ms` (default 500): silence after the last speech frame that ends the turn.

Besides the turn, the stream is cut into segments at shorter pauses (`pause_ms`): a segment is what
streaming recognition decodes as one piece, so it closes (and its last words become final) while
the turn may still go on. Pure and synchronous; rill.speech.live calls it off the trio thread.
"""

from __future__ import annotations

import enum
from typing import Literal

import msgspec
import numpy as np
import webrtcvad

from rill.speech.semantic_vad import check_eagerness, max_wait_ms

SAMPLE_RATE = 16_000
FRAME_MS = 30
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 480
SMOOTHING = 0.4  # weight of the newest frame's label in the speech probability
SILENCE_DBFS = -55.0  # a frame this quiet is silence (WebRTC's mode 0 hears speech in faint hiss)
_PCM16 = 32767.0


class TurnDetection(msgspec.Struct, frozen=True, kw_only=True):
    """`turn_detection: {"type": "server_vad", ...}`; None in its place means manual commit.

    semantic_vad (rill.speech.semantic_vad) runs on the same VAD, with `silence_duration_ms` its
    eagerness's cap: `TurnDetection.semantic(eagerness)`."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    eagerness: str = "auto"  # semantic_vad: low, medium, high or auto
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True  # answer each detected turn
    interrupt_response: bool = True  # speech during an answer cancels it (barge-in)

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold}")
        if not 0 <= self.prefix_padding_ms <= 10_000:
            raise ValueError(f"prefix_padding_ms must be 0..10000, got {self.prefix_padding_ms}")
        if not FRAME_MS <= self.silence_duration_ms <= 10_000:
            raise ValueError(f"silence_duration_ms must be {FRAME_MS}..10000, got {self.silence_duration_ms}")
        check_eagerness(self.eagerness)

    @classmethod
    def semantic(cls, eagerness: str = "auto", **flags) -> TurnDetection:
        check_eagerness(eagerness)
        return cls(type="semantic_vad", eagerness=eagerness, silence_duration_ms=max_wait_ms(eagerness), **flags)

    @property
    def is_semantic(self) -> bool:
        return self.type == "semantic_vad"


class Activity(enum.Enum):
    SPEECH_STARTED = "speech_started"  # a turn starts (and its first segment)
    RESUMED = "resumed"  # speech again after a pause, within the turn: a new segment
    PAUSED = "paused"  # pause_ms of silence: the segment ends at `at_sample`
    SPEECH_STOPPED = "speech_stopped"  # silence_duration_ms of silence: the turn ends at `at_sample`


class VadEvent(msgspec.Struct, frozen=True):
    kind: Activity
    at_sample: int  # onset (first speech frame) or end (after the last speech frame), from the stream start


def aggressiveness(threshold: float) -> int:
    return min(3, int(4 * threshold))


def frame_dbfs(frame: np.ndarray) -> float:
    rms = float(np.sqrt(np.mean(np.square(frame, dtype=np.float64))))
    return 20.0 * np.log10(max(rms, 1e-10))


class VoiceActivity:
    """One stream's detector: `feed(samples)` -> the events those samples complete, in order."""

    def __init__(self, turn: TurnDetection | None = None, pause_ms: int = 250):
        turn = turn or TurnDetection()
        self.threshold = turn.threshold
        self.silence_samples = turn.silence_duration_ms * SAMPLE_RATE // 1000
        self.pause_samples = min(pause_ms, turn.silence_duration_ms) * SAMPLE_RATE // 1000
        self._vad = webrtcvad.Vad(aggressiveness(turn.threshold))
        self._rest = np.zeros(0, dtype=np.float32)
        self.num_samples = 0  # classified so far (whole frames)
        self.probability = 0.0
        self.in_turn = False
        self.in_segment = False
        self.speech_end = 0  # after the last speech frame
        self._onset: int | None = None  # first frame of the current run of speech frames

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """16 kHz float32 samples; a trailing part frame waits for the next call."""
        audio = np.concatenate([self._rest, samples]) if len(self._rest) else samples
        num_frames = len(audio) // FRAME_SAMPLES
        events: list[VadEvent] = []
        for i in range(num_frames):
            self._frame(audio[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES], events)
        self._rest = audio[num_frames * FRAME_SAMPLES:].copy()
        return events

    def is_speech(self, frame: np.ndarray) -> bool:
        if frame_dbfs(frame) < SILENCE_DBFS:
            return False
        pcm = (np.clip(frame, -1.0, 1.0) * _PCM16).astype("<i2").tobytes()
        return self._vad.is_speech(pcm, SAMPLE_RATE)

    def _frame(self, frame: np.ndarray, events: list[VadEvent]) -> None:
        start = self.num_samples
        self.num_samples += FRAME_SAMPLES
        speech = self.is_speech(frame)
        self.probability += SMOOTHING * (float(speech) - self.probability)
        if speech:
            self.speech_end = self.num_samples
            self._onset = start if self._onset is None else self._onset
        else:
            self._onset = None
        if self.probability >= self.threshold and speech:
            self._speaking(events)
            return
        silence = self.num_samples - self.speech_end
        if self.in_segment and silence >= self.pause_samples:
            self.in_segment = False
            events.append(VadEvent(Activity.PAUSED, self.speech_end))
        if self.in_turn and silence >= self.silence_samples:
            self.in_turn = False
            events.append(VadEvent(Activity.SPEECH_STOPPED, self.speech_end))

    def _speaking(self, events: list[VadEvent]) -> None:
        if self.in_segment:
            return
        self.in_segment = True
        onset = self._onset if self._onset is not None else self.num_samples - FRAME_SAMPLES
        events.append(VadEvent(Activity.RESUMED if self.in_turn else Activity.SPEECH_STARTED, onset))
        self.in_turn = True


def quietest_sample(audio: np.ndarray, search_from: int) -> int:
    """The start of the quietest 30 ms frame of `audio[search_from:]`, an index into `audio`: where a
    segment that fills the model's window is cut, so that a word is least likely to be split."""
    tail = audio[search_from:]
    num_frames = len(tail) // FRAME_SAMPLES
    if num_frames < 2:
        return len(audio)
    frames = tail[:num_frames * FRAME_SAMPLES].reshape(num_frames, FRAME_SAMPLES)
    energy = np.square(frames, dtype=np.float64).mean(axis=1)
    return search_from + int(np.argmin(energy)) * FRAME_SAMPLES
