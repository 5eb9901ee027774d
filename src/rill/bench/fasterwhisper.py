"""The CTranslate2 sides of `rill bench transcribe`: faster-whisper, and CTranslate2's Whisper directly.

Both run the same weights converted by CTranslate2's own converter (`TransformersConverter`, what
`ct2-transformers-converter` runs) into a temporary directory, float32, with tokenizer.json and
preprocessor_config.json copied beside model.bin (faster-whisper reads both). Optional: `pip install
rill[bench-speech]`; without it both sides are reported as n/a with the reason.

faster-whisper: `WhisperModel.transcribe` greedy (beam 1, temperature 0, no fallback thresholds, no
timestamps, no VAD, no previous-text conditioning). Batch 1: one clip after another. Concurrent: C
Python threads share one WhisperModel with num_workers workers (its way to run calls in parallel;
CTranslate2's Whisper does not batch separate calls), threads split between the workers.
BatchedInferencePipeline is not used: it batches the VAD chunks of one long recording, and every clip
here is one chunk. faster-whisper pads or trims every window's features to 3000 frames (the default
of faster_whisper.audio.pad_or_trim, called without the model's nb_max_frames), so a model whose
window is shorter than 30 s is refused by CTranslate2; the side then reports that error as its reason.

ctranslate2: the engine under faster-whisper, `ctranslate2.models.Whisper.generate`, on features of
the model's own window (faster-whisper's FeatureExtractor on audio padded to the window, as
transformers computes them), greedy, no timestamps: batch 1, and static batches of C clips.
"""

from __future__ import annotations

import importlib.util
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rill.bench.common import progress
from rill.bench.speech_set import Clip, score

NOT_INSTALLED = "faster-whisper / ctranslate2 not installed (pip install 'rill[bench-speech]')"


def missing() -> str | None:
    """None when both libraries are installed, else why not."""
    absent = [name for name in ("ctranslate2", "faster_whisper") if importlib.util.find_spec(name) is None]
    return f"{NOT_INSTALLED}: no module {', '.join(absent)}" if absent else None


def convert(model_dir: Path, out_dir: Path) -> tuple[Path, float]:
    """CTranslate2's converter on the Hugging Face directory; returns (directory, seconds it took)."""
    from ctranslate2.converters import TransformersConverter

    t0 = time.perf_counter()
    TransformersConverter(str(model_dir), copy_files=["tokenizer.json", "preprocessor_config.json"]).convert(
        str(out_dir), quantization="float32", force=True)
    return out_dir, time.perf_counter() - t0


# -- faster-whisper ------------------------------------------------------------------------------


def run_faster_whisper(ct2_dir: Path, model_dir: Path, clips: list[Clip], *, language: str | None, threads: int,
                       concurrency: int, disable: bool) -> dict:
    """Both modes, or {"status": "n/a", "reason": ...} when faster-whisper cannot run this model."""
    from faster_whisper import WhisperModel

    # faster-whisper assumes Whisper's 448 decoder positions: the model's own limit, as rill and transformers use.
    # It passes len(prompt) + max_new_tokens to CTranslate2 as max_length.
    options = {"language": language,
               "max_new_tokens": ct2_max_length(model_dir, language) - len(prompt_tokens(model_dir, language))}
    single = WhisperModel(str(ct2_dir), device="cpu", compute_type="float32", cpu_threads=threads)
    try:
        _fw_text(single, clips[0].audio, options)  # warm-up, not timed; fails here if it cannot run
    except ValueError as exc:
        return {"status": "n/a", "reason": _why_not(single, exc)}
    out = {"status": "ok", "batch1": _fw_sequential(single, clips, options, disable)}
    workers = max(1, min(concurrency, threads))
    parallel = WhisperModel(str(ct2_dir), device="cpu", compute_type="float32", cpu_threads=max(1, threads // workers),
                            num_workers=workers)
    _fw_text(parallel, clips[0].audio, options)
    out["concurrent"] = _fw_threads(parallel, clips, options, concurrency, disable) | {"num_workers": workers}
    return out


def max_target_positions(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["max_target_positions"]


def ct2_max_length(model_dir: Path, language: str | None) -> int:
    """CTranslate2 4.8's Whisper.generate stops after max_length // 2 new tokens (measured on a model that never
    says EOS: max_length 30 -> 15 tokens, 48 -> 24, 88 -> 44), so twice the window's room gives the limit rill
    and transformers decode to: max_target_positions less the prompt."""
    return 2 * (max_target_positions(model_dir) - len(prompt_tokens(model_dir, language)))


def prompt_tokens(model_dir: Path, language: str | None = None) -> list[str]:
    """A window's decoder prompt with no previous text and no timestamps, as rill and transformers build it."""
    gen = json.loads((model_dir / "generation_config.json").read_text())
    tokens = ["<|startoftranscript|>"]
    if gen.get("is_multilingual"):
        tokens += [f"<|{language or 'en'}|>", "<|transcribe|>"]
    return tokens + ["<|notimestamps|>"]


def _why_not(model, exc: ValueError) -> str:
    frames = model.feature_extractor.nb_max_frames
    return (f"faster-whisper pads or trims every window to 3000 mel frames (30 s: faster_whisper.audio.pad_or_trim's "
            f"default length, which WhisperModel.generate_segments calls without the model's window); this model's "
            f"window is {frames} frames ({model.feature_extractor.chunk_length} s, max_source_positions "
            f"{frames // 2}), and CTranslate2 refuses the padded input: {exc}")


def _fw_text(model, audio: np.ndarray, options: dict) -> str:
    segments, _ = model.transcribe(audio, **options, beam_size=1, best_of=1, temperature=0.0,
                                   without_timestamps=True, vad_filter=False, condition_on_previous_text=False,
                                   compression_ratio_threshold=None, log_prob_threshold=None,
                                   no_speech_threshold=None)
    return "".join(s.text for s in segments).strip()  # segments is lazy: decoding happens here


def _fw_sequential(model, clips: list[Clip], options: dict, disable: bool) -> dict:
    texts = []
    t0 = time.perf_counter()
    for clip in progress(clips, desc="faster-whisper batch 1", disable=disable):
        texts.append(_fw_text(model, clip.audio, options))
    return score(clips, texts, time.perf_counter() - t0)


def _fw_threads(model, clips: list[Clip], options: dict, concurrency: int, disable: bool) -> dict:
    with progress(total=len(clips), desc=f"faster-whisper {concurrency} threads", disable=disable) as bar:
        def one(clip):
            text = _fw_text(model, clip.audio, options)
            bar.update(1)
            return text

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            texts = list(pool.map(one, clips))
        seconds = time.perf_counter() - t0
    return score(clips, texts, seconds) | {"threads": concurrency}


# -- CTranslate2 directly ------------------------------------------------------------------------


class Ct2Whisper:
    """ctranslate2.models.Whisper with the prompt, features and decoding rill and transformers use."""

    def __init__(self, ct2_dir: Path, model_dir: Path, language: str | None, threads: int):
        import ctranslate2
        from faster_whisper.feature_extractor import FeatureExtractor
        from tokenizers import Tokenizer

        self.ctranslate2 = ctranslate2
        self.model = ctranslate2.models.Whisper(str(ct2_dir), device="cpu", compute_type="float32",
                                                intra_threads=threads)
        pre = json.loads((ct2_dir / "preprocessor_config.json").read_text())
        self.features = FeatureExtractor(pre["feature_size"], pre["sampling_rate"], pre["hop_length"],
                                         pre["chunk_length"], pre["n_fft"])
        self.tokenizer = Tokenizer.from_file(str(ct2_dir / "tokenizer.json"))
        self.prompt = prompt_tokens(model_dir, language)
        self.max_length = ct2_max_length(model_dir, language)

    def transcribe(self, audios: list[np.ndarray]) -> list[str]:
        n = self.features.n_samples
        mels = [self.features(np.pad(a[:n], (0, n - len(a[:n]))), padding=0)[:, : self.features.nb_max_frames]
                for a in audios]
        batch = self.ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(mels), dtype=np.float32))
        results = self.model.generate(batch, [self.prompt] * len(audios), beam_size=1, max_length=self.max_length)
        return [self.tokenizer.decode(r.sequences_ids[0], skip_special_tokens=True).strip() for r in results]


def run_ctranslate2(ct2_dir: Path, model_dir: Path, clips: list[Clip], *, language: str | None, threads: int,
                    concurrency: int, disable: bool) -> dict:
    whisper = Ct2Whisper(ct2_dir, model_dir, language, threads)
    whisper.transcribe([clips[0].audio])  # warm-up, not timed
    out = {"status": "ok"}
    for mode, size in (("batch1", 1), ("concurrent", concurrency)):
        texts = []
        t0 = time.perf_counter()
        for start in progress(range(0, len(clips), size), desc=f"ctranslate2 batch {size}", disable=disable):
            texts += whisper.transcribe([c.audio for c in clips[start : start + size]])
        out[mode] = score(clips, texts, time.perf_counter() - t0) | {"batch_size": size}
    return out
