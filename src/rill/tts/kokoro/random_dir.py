"""A Kokoro directory with random weights, laid out as the authors ship theirs, for tests and
`rill bench speak` (rill and the `kokoro` package load the same files).

    make_random_kokoro_dir(path, shape="small", seed=0)

writes config.json (Kokoro v1.0's vocabulary), kokoro-v1_0.pth (component -> state dict, keys
prefixed "module." and weight-normed convolutions as (weight_g, weight_v), as the release has
them), optionally model.safetensors, and voices/{af_alloy,am_echo,bf_nova}.pt ([510, 1, 256]).
A few parameters are set rather than random so the audio behaves like speech in its timing: a
phoneme lasts a few frames (the duration head's bias), the pitch sits near 150 Hz so the harmonic
source is voiced, and the generator's convolutions start small as the authors initialise them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rill.tts.kokoro.config import COMPONENTS, KokoroConfig
from rill.tts.kokoro.layers import WNConv1d, WNConvTranspose1d
from rill.tts.kokoro.model import KokoroModel
from rill.tts.kokoro.vocab import KOKORO_V1_N_TOKEN, KOKORO_V1_VOCAB

VOICE_NAMES = ("af_alloy", "am_echo", "bf_nova")
VOICE_ROWS = 510  # one style per phoneme-string length, as Kokoro's voice packs hold

KOKORO_82M_ISTFTNET = {
    "upsample_rates": [10, 6], "upsample_kernel_sizes": [20, 12], "upsample_initial_channel": 512,
    "resblock_kernel_sizes": [3, 7, 11], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "gen_istft_n_fft": 20, "gen_istft_hop_size": 5,
}
KOKORO_82M_PLBERT = {
    "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048,
    "max_position_embeddings": 512, "num_hidden_layers": 12, "dropout": 0.1,
}

# hidden_dim 512, style_dim 128 and upsample_initial_channel 512 are fixed by the architecture (the
# decoder's text residual, the voice's two halves, the decoder's output width); the rest is free.
SHAPES: dict[str, dict] = {
    "kokoro-82m": {"plbert": KOKORO_82M_PLBERT, "istftnet": KOKORO_82M_ISTFTNET},
    "small": {
        "plbert": {**KOKORO_82M_PLBERT, "hidden_size": 128, "num_attention_heads": 4,
                   "intermediate_size": 256, "num_hidden_layers": 2},
        "istftnet": KOKORO_82M_ISTFTNET,
    },
    "wide": {
        "plbert": {**KOKORO_82M_PLBERT, "hidden_size": 96, "num_attention_heads": 3,
                   "intermediate_size": 320, "num_hidden_layers": 3},
        "istftnet": {**KOKORO_82M_ISTFTNET, "resblock_kernel_sizes": [3, 5],
                     "resblock_dilation_sizes": [[1, 3, 5], [1, 2, 4]]},
        "n_layer": 2, "text_encoder_kernel_size": 3, "max_dur": 20,
    },
    "stft": {
        "plbert": {**KOKORO_82M_PLBERT, "hidden_size": 64, "num_attention_heads": 2,
                   "intermediate_size": 128, "num_hidden_layers": 2},
        "istftnet": {"upsample_rates": [5, 5, 3], "upsample_kernel_sizes": [11, 11, 7],
                     "upsample_initial_channel": 512, "resblock_kernel_sizes": [3, 7],
                     "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]], "gen_istft_n_fft": 16,
                     "gen_istft_hop_size": 4},
    },
}


def shape_config(shape: str) -> dict:
    spec = SHAPES[shape]
    return {
        "vocab": KOKORO_V1_VOCAB, "n_token": KOKORO_V1_N_TOKEN, "hidden_dim": 512, "style_dim": 128,
        "n_layer": spec.get("n_layer", 3), "max_dur": spec.get("max_dur", 50), "dropout": 0.2,
        "text_encoder_kernel_size": spec.get("text_encoder_kernel_size", 5), "n_mels": 80,
        "dim_in": 64, "max_conv_dim": 512, "multispeaker": True,
        "plbert": spec["plbert"], "istftnet": spec["istftnet"],
    }


def make_random_kokoro_dir(path, shape: str = "small", seed: int = 0, safetensors: bool = False) -> Path:
    """Write a random-weight Kokoro directory at `path` (created if absent); returns the path."""
    path = Path(path)
    (path / "voices").mkdir(parents=True, exist_ok=True)
    raw = shape_config(shape)
    (path / "config.json").write_text(json.dumps(raw, ensure_ascii=False, indent=1), encoding="utf-8")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fields = {k: v for k, v in raw.items() if k in KokoroConfig.__struct_fields__}
        model = KokoroModel(KokoroConfig(**fields))
        shape_for_speech(model)
        torch.save(authors_layout(model), path / "kokoro-v1_0.pth")
        if safetensors:
            from safetensors.torch import save_file

            layout = authors_layout(model, prefix="")
            flat = {f"{part}.{key}": t.contiguous() for part, sd in layout.items() for key, t in sd.items()}
            save_file(flat, str(path / "model.safetensors"))
        for name in VOICE_NAMES:
            torch.save(torch.randn(VOICE_ROWS, 1, 256) * 0.3, path / "voices" / f"{name}.pt")
    return path


@torch.no_grad()
def shape_for_speech(model: KokoroModel) -> None:
    duration = model.predictor.duration_proj.linear_layer
    duration.weight.mul_(0.1)
    duration.bias.fill_(-2.3)  # sigmoid(-2.3) * 50 outputs: about 4-5 frames (100-125 ms) per phoneme
    for proj in (model.predictor.F0_proj,):
        proj.weight.mul_(0.1)
        proj.bias.fill_(150.0)
    for module in model.decoder.generator.modules():
        if isinstance(module, (WNConv1d, WNConvTranspose1d)):
            module.weight.normal_(0.0, 0.01)


def authors_layout(model: KokoroModel, prefix: str = "module.") -> dict[str, dict[str, torch.Tensor]]:
    """component -> state dict as KModel loads it: weight-normed weights split into (g, v)."""
    normed = {name for name, m in model.named_modules() if isinstance(m, (WNConv1d, WNConvTranspose1d))}
    out: dict[str, dict[str, torch.Tensor]] = {part: {} for part in COMPONENTS}
    for key, tensor in model.state_dict().items():
        part, _, rest = key.partition(".")
        owner, _, leaf = key.rpartition(".")
        if owner in normed and leaf == "weight":
            dims = list(range(1, tensor.dim()))
            out[part][f"{prefix}{rest}_g"] = tensor.norm(dim=dims, keepdim=True).clone()
            out[part][f"{prefix}{rest}_v"] = tensor.clone()
        else:
            out[part][f"{prefix}{rest}"] = tensor.clone()
    return out
