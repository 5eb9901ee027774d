"""Shared pieces of the benchmarks: random-weight model directories, workloads' token ids,
latency summaries, progress bars, and the JSON + PNG each benchmark writes.

matplotlib and transformers are optional (the `bench` and `test` extras); they are imported
inside the functions that need them, so `rill bench --help` works without them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

RESULTS_DIR = Path("bench-results")

# Llama-shaped random models. "random-small" makes the engine's own bookkeeping the main cost;
# "random-100m" (~102M parameters: 6.3M embedding + 6.3M head + 12 x 7.5M layers) is big enough
# that the model dominates, as with a real checkpoint.
RANDOM_MODELS: dict[str, dict] = {
    "random-small": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
    ),
    "random-100m": dict(
        vocab_size=8192, hidden_size=768, intermediate_size=2560, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=8192,
    ),
    # Issue 33's comparison with vLLM: a Qwen2 (q/k/v biases, tied embeddings: ~100M parameters,
    # 400 MB in float32) with a 32k vocabulary, so the LM head costs what a real one does.
    "random-qwen2-100m": dict(
        architecture="qwen2", vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=8192, tie_word_embeddings=True,
    ),
    # Issue 32's GPU comparison: Qwen2-0.5B's shapes (494M parameters, 151,936-token vocabulary; the
    # tokenizer is trained to at most 32k of them, prompts draw from those).
    "random-qwen2-0.5b": dict(
        architecture="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
    ),
}
_MODEL_FORMAT = 1  # bump when the way models are made changes; old cached directories are ignored
# Qwen2-shaped models: their tokenizer.json pre-tokenizes as Qwen2's does (digits one by one) since format 2.
# transformers 5 builds a qwen2 directory's tokenizer with Qwen2's own pre-tokenizer whatever tokenizer.json
# says, so vLLM (and its benchmark client) split "971" into three tokens where rill's tokenizer.json, with
# GPT-2's rule, kept " 971" whole: on vLLM's random prompts rill prefilled about 4% fewer tokens.
_QWEN2_FORMAT = 2
# Qwen2's pre-tokenizer pattern (its tokenizer.json): as GPT-2's, but a number is split into single digits.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NUM_SPECIAL_TOKENS = len(SPECIAL_TOKENS)  # ids 0..2; workloads draw ordinary ids above them


def default_cache_dir() -> Path:
    return Path(os.environ.get("RILL_BENCH_CACHE", Path.home() / ".cache" / "rill" / "bench"))


# -- arguments and outputs ---------------------------------------------------------------------


def add_common_args(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--json", type=Path, default=RESULTS_DIR / f"{name}.json", help="results file (default: %(default)s)")
    p.add_argument("--png", type=Path, default=None, help="plot file (default: the JSON file's stem + .png)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where random models are kept (default: $RILL_BENCH_CACHE or ~/.cache/rill/bench)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and workload")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's own; on a busy machine 1 avoids thread contention)")


def apply_threads(args) -> None:
    """Set torch's intra-op thread count when --threads is given (both sides of a comparison share it)."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


def png_path(args) -> Path:
    return args.png if args.png is not None else args.json.with_suffix(".png")


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def save_plot(path: Path, draw: Callable, *, ncols: int = 1, title: str | None = None) -> Path:
    """Render `draw(axes)` (a list of ncols matplotlib Axes) into a PNG with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4), squeeze=False)
    try:
        draw(list(axes[0]))
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", disable: bool = False):
    """A tqdm bar on stderr (a no-op bar when disabled)."""
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, disable=disable, leave=False, dynamic_ncols=True)


# -- numbers -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def summarize_ms(seconds: Sequence[float]) -> dict:
    """Mean / p50 / p99 / min / max in milliseconds of a sample of durations in seconds."""
    if not seconds:
        return {"n": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None, "min_ms": None, "max_ms": None}
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "mean_ms": statistics.fmean(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


def random_token_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    """n ordinary (non-special) token ids, drawn uniformly."""
    return [rng.randrange(NUM_SPECIAL_TOKENS, vocab_size) for _ in range(n)]


# -- random-weight models ------------------------------------------------------------------------


def resolve_model(spec: str, cache_dir: Path | None = None, seed: int = 0) -> str:
    """`random-small` / `random-100m`: a cached random-weight directory (made on first use);
    `rill-tiny` or a path: passed through for the engine to load."""
    if spec in RANDOM_MODELS:
        return str(make_random_model_dir(spec, cache_dir, seed=seed))
    return spec


def make_random_model_dir(name: str, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """A Llama-shaped model with random float32 weights and a small ByteLevel BPE tokenizer, saved as
    a Hugging Face directory under cache_dir. Built once into a temporary directory, then renamed,
    so an interrupted build never leaves a half-written model behind."""
    shape = RANDOM_MODELS[name]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    qwen2 = shape.get("architecture") == "qwen2"
    final = root / f"{name}-seed{seed}-v{_QWEN2_FORMAT if qwen2 else _MODEL_FORMAT}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        _write_model_dir(tmp, shape, seed)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished first
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_model_dir(path: Path, shape: dict, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    shape = dict(shape)
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if shape.pop("architecture", "llama") == "qwen2" \
        else (LlamaConfig, LlamaForCausalLM)

    tokenizer = _train_tokenizer(min(shape["vocab_size"], 32000), seed, qwen2=config_cls is Qwen2Config)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
        "model_max_length": shape["max_position_embeddings"],
    }), encoding="utf-8")
    # A wider init than the default keeps logits apart, so greedy choices are not float noise.
    shape.setdefault("tie_word_embeddings", False)
    config = config_cls(**shape, initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    model.save_pretrained(path)


def _train_tokenizer(vocab_size: int, seed: int, qwen2: bool = False):
    """A ByteLevel BPE (every byte encodable) trained on synthetic words; at most vocab_size ids,
    so every token id is also a row of the model's embedding (a 32k vocabulary needs more words
    than the default text holds merges for). qwen2: pre-tokenized as Qwen2's tokenizer.json does."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if qwen2:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = _synthetic_text(seed) if vocab_size <= 8192 else _synthetic_text(seed, num_words=40000, num_lines=20000)
    tok.train_from_iterator(text, trainer)
    return tok


def _synthetic_text(seed: int, num_words: int = 3000, num_lines: int = 2000) -> list[str]:
    """Lines of made-up words (random syllables): enough distinct merges for a few thousand tokens."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "st", "ng", "qu", "x"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(num_words)]
    punctuation = [".", ",", "!", "?", ";", ":", ""]
    return [
        " ".join(rng.choices(words, k=rng.randint(4, 16))) + rng.choice(punctuation) + f" {rng.randint(0, 999)}"
        for _ in range(num_lines)
    ]
