"""Which dtype a model runs in (`--dtype`, `RILL_DTYPE`), and on the CPU which kernels that takes.

`auto` (or no flag) runs the checkpoint's own dtype, the one exact choice, with one exception on the
CPU: float16 has no C path there (rill's CPU kernels take float32 and bfloat16: kernels/cpu_build.py),
and torch's float16 matrix products on a CPU are several times slower than float32's, so a float16
model runs as float32 on the CPU — widening float16 is exact, where narrowing it to bfloat16 would drop
three bits of every weight. An explicit `--dtype float16` on the CPU takes the same path and says so
with a warning: never the slow path silently. A bfloat16 checkpoint stays bfloat16 (half the bytes of
float32 per decode step: kernels/cpu_linear_bf16.c); a float32 one stays float32 (bfloat16 would not
be exact). The choice and the kernels it takes are logged at load.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from rill.models.config import ModelConfig, load_model_config

log = logging.getLogger("rill.models")

AUTO = "auto"


def load_config_for_device(model_dir: Path, generation: dict, dtype: str | None, device: str) -> ModelConfig:
    """load_model_config with the rule above for `device` (dtype None or "auto": the checkpoint's own)."""
    explicit = dtype not in (None, AUTO)
    cfg = load_model_config(model_dir, generation, dtype if explicit else None)
    if torch.device(device).type != "cpu":
        return cfg
    how = "as asked" if explicit else "auto"
    if cfg.dtype == torch.float16:
        how = "from float16"
        (log.warning if explicit else log.info)(
            "%s: float16 has no fast path on the CPU; running as float32 (exact widening; rill's C kernels take "
            "float32 and bfloat16)", model_dir.name)
        cfg = load_model_config(model_dir, generation, "float32")
    log.info("%s: dtype %s (%s) on the CPU: %s", model_dir.name, str(cfg.dtype).removeprefix("torch."), how,
             cpu_path(cfg.dtype))
    return cfg


def cpu_path(dtype: torch.dtype) -> str:
    """The kernels a model of this dtype takes on this CPU, in words (for the log and `rill serve`'s banner)."""
    from rill.kernels import cpu_build

    if dtype not in (torch.float32, torch.bfloat16):
        return "torch's kernels (no C path for this dtype)"
    why = cpu_build.unavailable_reason()
    if why is not None:
        return f"torch's kernels (rill's C kernels are unavailable: {why})"
    if dtype == torch.bfloat16:
        return f"rill's C kernels, bfloat16 path {cpu_build.bf16_path()} (build {cpu_build.isa()})"
    return f"rill's C kernels, float32 (build {cpu_build.isa()})"
