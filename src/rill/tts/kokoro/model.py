"""Kokoro-82M's architecture as one module: phoneme ids + a style vector -> 24 kHz audio.

    bert, bert_encoder   ALBERT over the phonemes, projected to the predictor's width
    predictor            durations per phoneme, then F0 and energy per frame
    text_encoder         phoneme features for the decoder
    decoder              iSTFTNet: features aligned to frames -> waveform

A voice is a 256-vector: its first half styles the decoder, its second half the predictor.
`synthesize` runs a batch: the text side per utterance, the decoder once for all, padded with masks
(see layers.py) so each row equals the same utterance run alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rill.tts.kokoro.albert import Albert
from rill.tts.kokoro.config import KokoroConfig
from rill.tts.kokoro.decoder import Decoder
from rill.tts.kokoro.prosody import ProsodyPredictor, TextEncoder

BOUNDARY_TOKEN = 0  # Kokoro wraps every phoneme sequence in token 0 on both sides


class KokoroModel(nn.Module):
    def __init__(self, config: KokoroConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_dim
        self.bert = Albert(config.plbert, config.n_token)
        self.bert_encoder = nn.Linear(int(config.plbert["hidden_size"]), hidden)
        self.predictor = ProsodyPredictor(config.style_dim, hidden, config.n_layer, config.max_dur)
        self.text_encoder = TextEncoder(hidden, config.text_encoder_kernel_size, config.n_layer, config.n_token)
        self.decoder = Decoder(hidden, config.style_dim, config.istftnet)

    @property
    def max_tokens(self) -> int:
        """Phoneme ids one utterance may hold: ALBERT's positions less the two boundary tokens."""
        return self.bert.max_positions - 2

    def synthesize(
        self, token_ids: Sequence[Sequence[int]], styles: torch.Tensor, speeds: Sequence[float],
        seeds: Sequence[int],
    ) -> list[torch.Tensor]:
        """token_ids: one list of phoneme ids per utterance; styles [B, 256]; -> one [samples] per row.

        The text side runs per utterance (prosody.py says why); the decoder, most of the work, runs
        once for the batch, padded to the longest utterance's frames.
        """
        half = self.config.style_dim
        rows = [self.prosody(ids, styles[b : b + 1, half:], float(speeds[b])) for b, ids in enumerate(token_ids)]
        frames = torch.tensor([asr.shape[-1] for asr, _, _ in rows], device=styles.device)
        asr, f0, energy = (pad_stack([row[i] for row in rows]) for i in range(3))
        gens = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        return [a.squeeze(0) for a in self.decoder(asr, f0, energy, styles[:, :half], frames, gens)]

    def prosody(self, token_ids: Sequence[int], style: torch.Tensor, speed: float):
        """One utterance -> (text features [1, C, F] aligned to frames, F0 [1, 2F], energy [1, 2F])."""
        if len(token_ids) > self.max_tokens:
            raise ValueError(f"{len(token_ids)} phoneme ids; Kokoro takes at most {self.max_tokens}")
        ids = torch.tensor([[BOUNDARY_TOKEN, *token_ids, BOUNDARY_TOKEN]], device=style.device)
        d_en = self.bert_encoder(self.bert(ids)).transpose(1, 2)
        d = self.predictor.text_encoder(d_en, style)  # [1, N, C + style]
        durations = self.predictor.durations(d, speed)[0]  # [N]
        # aligning is repeating each token's column for its frames: the reference's one-hot matrix
        # product, exactly (every other term is an exact zero)
        f0, energy = self.predictor.curves(d.transpose(1, 2).repeat_interleave(durations, dim=-1), style)
        return self.text_encoder(ids).repeat_interleave(durations, dim=-1), f0, energy


def pad_stack(rows: list[torch.Tensor]) -> torch.Tensor:
    """[1, ..., T_b] rows -> [B, ..., max T] with zeros past each row's end."""
    width = max(row.shape[-1] for row in rows)
    return torch.cat([F.pad(row, (0, width - row.shape[-1])) for row in rows])
