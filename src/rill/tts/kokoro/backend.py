"""KokoroBackend: a Kokoro directory behind rill's VoiceBackend contract (rill.tts.backend).

Each utterance's text becomes phonemes (libespeak-ng, in Kokoro's alphabet), cut to pieces the model
takes (phonemes.py); every piece is a row of one `KokoroModel.synthesize` call, and each
utterance's rows are joined again. The decoder batches rows where that pays: on CUDA one padded
forward for the whole call; on the CPU row by row, because its convolutions already use every core
and a batch only adds padding (measured: 3 equal rows took 7.9 s batched, 3 x 2.4 s alone).
Calls come from the speech-out worker thread, under torch.inference_mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rill.tts.backend import UnknownVoice, Utterance, VoiceInfo
from rill.tts.kokoro.config import load_state, read_config, read_voices, weights_file
from rill.tts.kokoro.model import KokoroModel
from rill.tts.kokoro.phonemes import phonemize_for_kokoro, split_phonemes
from rill.tts.kokoro.vocab import to_ids

SAMPLE_RATE = 24000
MAX_BATCH = 16
# Kokoro's voice names start with a language letter (af_heart: American English, female)
LANGUAGES = {"a": "en-us", "b": "en-gb", "e": "es", "f": "fr", "h": "hi", "i": "it", "p": "pt-br",
             "j": "ja", "z": "cmn"}


class KokoroBackend:
    sample_rate = SAMPLE_RATE

    def __init__(self, name: str, model: KokoroModel, voice_packs: dict[str, torch.Tensor],
                 device: torch.device, decode_together: bool | None = None, seed: int = 0):
        self.name = name
        self.model = model
        self.packs = {k: v.to(device) for k, v in voice_packs.items()}
        self.device = device
        self.decode_together = device.type == "cuda" if decode_together is None else decode_together
        # Decoded one at a time (the CPU), a batch only makes every request wait for the whole call's audio:
        # the worker then takes one clause a call, round robin, and each clause's audio leaves as it is made.
        self.max_batch = MAX_BATCH if self.decode_together else 1
        self.seed = seed  # every utterance's noise starts from it: the same text gives the same audio

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(id=v, name=f"{v} (Kokoro, {self.name})", language=voice_language(v)) for v in self.packs]

    def resolve_voice(self, voice: str) -> str:
        """A voice file's name (af_alloy), or an OpenAI name (alloy) that one of them ends with."""
        if voice in self.packs:
            return voice
        for name in self.packs:
            if name.partition("_")[2] == voice:
                return name
        raise UnknownVoice(f"voice {voice!r} is not one of {self.name}'s: {', '.join(self.packs)}")

    def phonemize(self, text: str, voice: str) -> str:
        """The text's phonemes in Kokoro's alphabet, by libespeak-ng in the voice's language."""
        from rill.tts.libespeak import phonemize

        return phonemize_for_kokoro(text, voice_language(voice), phonemize)

    def synthesize(self, batch: Sequence[Utterance]) -> list[np.ndarray]:
        pieces = [split_phonemes(self.phonemize(u.text, u.voice)) for u in batch]
        rows = [(k, ps) for k, utterance_pieces in enumerate(pieces) for ps in utterance_pieces]
        audio = self.synthesize_phonemes([ps for _, ps in rows], [batch[k].voice for k, _ in rows],
                                         [batch[k].speed for k, _ in rows])
        out: list[list[np.ndarray]] = [[] for _ in batch]
        for (k, _), samples in zip(rows, audio):
            out[k].append(samples)
        return [np.concatenate(parts) if parts else np.zeros(0, np.float32) for parts in out]

    def synthesize_phonemes(self, phonemes: list[str], voices: list[str], speeds: list[float]) -> list[np.ndarray]:
        """One float32 array in [-1, 1] per phoneme string (each at most MAX_PHONEMES long)."""
        if not phonemes:
            return []
        styles = torch.cat([self.style(ps, v) for ps, v in zip(phonemes, voices)])
        ids = [to_ids(ps, self.model.config.vocab) for ps in phonemes]
        groups = [range(len(ids))] if self.decode_together else [range(k, k + 1) for k in range(len(ids))]
        audio: list[torch.Tensor] = []
        with torch.inference_mode():
            for g in groups:
                audio += self.model.synthesize([ids[k] for k in g], styles[g.start : g.stop],
                                               [speeds[k] for k in g], [self.seed] * len(g))
        return [a.clamp(-1.0, 1.0).float().cpu().numpy() for a in audio]

    def style(self, ps: str, voice: str) -> torch.Tensor:
        """The voice's style for a string of this length ([1, 256]), as KPipeline picks it."""
        pack = self.packs[voice]
        return pack[min(max(len(ps), 1), pack.shape[0]) - 1].reshape(1, -1)


def voice_language(voice: str) -> str:
    return LANGUAGES.get(voice[:1], "en-us")


def load_kokoro_backend(path, device: str | None = None, decode_together: bool | None = None) -> KokoroBackend:
    """A Kokoro directory (config.json, *.pth or *.safetensors, voices/*.pt) from local disk."""
    path = Path(path)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = read_config(path)
    model = KokoroModel(config).eval()
    load_state(model, weights_file(path))
    return KokoroBackend(path.name, model.to(dev), read_voices(path), dev, decode_together)
