"""VoxtralCore: whole recordings (/v1/audio/transcriptions) through Voxtral Realtime streams, with
SpeechCore's interface (add_request / abort / has_work / step), so rill's speech worker drives it.

The file path is Kyutai's (rill.speech.kyutai.core): each request is a VoxtralStream fed from the uploaded
16 kHz samples (Voxtral's own rate: no resampling), `chunk_s` of audio per request per step in arrival
order, and segments are `segment_s` spans of audio with the text written while they were heard. Only the
stream differs, so the chunking and segmenting are inherited.

Live streams (realtime sessions, Mode A/B audio chunks) are the core's `live` (rill.speech.causal's
LiveStreams over VoxtralCausal), stepped after the file requests' chunks, as Kyutai's core does. Greedy
decoding only, no prompt or prefix, no translation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rill.errors import ValidationError
from rill.speech.causal import LiveStreams
from rill.speech.decoding import TranscribeParams
from rill.speech.audio import SAMPLE_RATE as INPUT_RATE
from rill.speech.kyutai.core import KyutaiCore, KyutaiRequest, _validate
from rill.speech.voxtral_realtime.live import VoxtralCausal
from rill.speech.voxtral_realtime.loader import VoxtralRuntime, load_voxtral_realtime
from rill.speech.voxtral_realtime.stream import VoxtralStream


class VoxtralCore(KyutaiCore):
    """Synchronous; owned by the speech worker thread. `delay_ms`: the transcription delay of every
    request (default: the model's, tekken.json's `transcription_delay_ms`). `early_stop`: every stream,
    file or live, ends at the first streaming pad past its audio's end plus the delay (VoxtralStream)."""

    def __init__(self, path_or_runtime: str | Path | VoxtralRuntime, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, chunk_s: float = 2.0, segment_s: float = 10.0,
                 delay_ms: float | None = None, early_stop: bool = False, **_ignored):
        runtime = path_or_runtime
        if not isinstance(runtime, VoxtralRuntime):
            runtime = load_voxtral_realtime(runtime, device, dtype or torch.float32)
        if runtime.sampling_rate != INPUT_RATE:
            raise ValueError(f"{runtime.name}: the model hears at {runtime.sampling_rate} Hz, uploads come at "
                             f"{INPUT_RATE} Hz")
        runtime.audio.num_delay_tokens(delay_ms)  # a bad delay fails at load, not at the first request
        self.runtime = runtime
        self.model_name = runtime.name
        self.delay_ms, self.early_stop = delay_ms, early_stop
        self.chunk_s, self.segment_s = chunk_s, segment_s
        self.requests: dict[str, KyutaiRequest] = {}
        self.live = LiveStreams(VoxtralCausal(runtime, delay_ms, early_stop))

    def add_request(self, request_id: str, audio: np.ndarray, params: TranscribeParams,
                    sample_rate: int = INPUT_RATE) -> None:
        """Queue 16 kHz mono float32 audio; raises ValidationError (and keeps nothing) if it cannot run."""
        if request_id in self.requests:
            raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
        _validate(params)
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValidationError(f"audio must be 1-D mono samples, got shape {audio.shape}", param="file")
        if sample_rate != INPUT_RATE:
            raise ValidationError(f"{self.model_name} takes audio at {INPUT_RATE} Hz, got {sample_rate} Hz",
                                  param="sample_rate")
        stream = VoxtralStream(self.runtime, INPUT_RATE, delay_ms=self.delay_ms, early_stop=self.early_stop)
        # The model is told no language; the one asked for (if any) is reported back, as Kyutai's core does.
        self.requests[request_id] = KyutaiRequest(request_id, audio, params.language or "en", stream, INPUT_RATE,
                                                  int(self.chunk_s * INPUT_RATE), int(self.segment_s * INPUT_RATE))
