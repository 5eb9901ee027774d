"""Voxtral Realtime (VoxtralRealtimeForConditionalGeneration) in rill's own torch: a causal audio encoder
and a delayed-text decoder, streamed 80 ms frame by 80 ms frame with bounded caches."""

from rill.speech.voxtral_realtime.config import AudioSpec, LayerStack, VoxtralSpec
from rill.speech.voxtral_realtime.loader import VoxtralRuntime, is_voxtral_realtime_dir, load_voxtral_realtime
from rill.speech.voxtral_realtime.stream import VoxtralStream
from rill.speech.voxtral_realtime.tekken import Tekken

__all__ = ["AudioSpec", "LayerStack", "Tekken", "VoxtralRuntime", "VoxtralSpec", "VoxtralStream",
           "is_voxtral_realtime_dir", "load_voxtral_realtime"]
