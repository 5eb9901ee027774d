"""Kyutai STT (KyutaiSpeechToTextForConditionalGeneration) in rill's own torch: a causal Mimi encoder and
a delayed-text decoder, streamed frame by frame with bounded caches."""

from rill.speech.kyutai.config import KyutaiSpec, MimiSpec, PaddingSpec
from rill.speech.kyutai.loader import KyutaiRuntime, is_kyutai_dir, load_kyutai
from rill.speech.kyutai.stream import KyutaiStream, StreamDelta

__all__ = ["KyutaiRuntime", "KyutaiSpec", "KyutaiStream", "MimiSpec", "PaddingSpec", "StreamDelta",
           "is_kyutai_dir", "load_kyutai"]
