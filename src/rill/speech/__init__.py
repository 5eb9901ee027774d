"""Speech in: Whisper-family models, their decoding and batched engine core."""

from rill.speech.core import SpeechCore
from rill.speech.decoding import Segment, SpeechDelta, TranscribeParams, Transcription
from rill.speech.whisper import WhisperRuntime, load_whisper

__all__ = ["Segment", "SpeechCore", "SpeechDelta", "TranscribeParams", "Transcription", "WhisperRuntime",
           "load_whisper"]
