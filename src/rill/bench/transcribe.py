"""`rill bench transcribe`: the same spoken questions through rill, transformers and faster-whisper.

The audio set: --n held-out questions of the rill-tiny-speech recipe, spoken by `espeak-ng -w` into
WAV files under --cache-dir (made once; see rill.bench.speech_set), each within one window of the
model. Files are decoded once, untimed; every in-process side gets the same 16 kHz samples (its own
log-mel front end is timed), all decode greedily without timestamps, English for a multilingual model.

    rill           SpeechCore in this process. Batch 1: one request after another. Concurrent: all
                   requests added at once, continuous batching over --concurrency rows.
    rill-http      `rill serve` in this process (with rill-tiny beside it, as served by default) and
                   POST /v1/audio/transcriptions with the WAV files: 1 client, then --concurrency
                   clients at once (upload, decoding and HTTP included).
    transformers   WhisperForConditionalGeneration.generate: batches of 1, then of --concurrency.
    faster-whisper / ctranslate2: the weights converted by CTranslate2's own converter; see
                   rill.bench.fasterwhisper (optional extra `bench-speech`; n/a with the reason otherwise).

Reported per side and mode: real-time factor (processing seconds / audio seconds), words per second
(reference words / processing seconds), exact transcripts, agreement with rill's text; and rill's speed
over transformers' (their seconds / rill's). Model loading and one warm-up clip per side are not timed.
Target (issue 18): rill >= 2x transformers.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from pathlib import Path

from rill.bench import fasterwhisper
from rill.bench.common import add_common_args, default_cache_dir, progress, save_plot
from rill.bench.speech_set import Clip, load_audio_set, score

NAME = "transcribe"
TARGET_SPEEDUP = 2.0
SIDES = ("rill", "rill_http", "transformers", "faster_whisper", "ctranslate2")
MODES = ("batch1", "concurrent")
HTTP_TIMEOUT_S = 600.0


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--model", default="rill-tiny-speech", help="rill-tiny-speech | a Whisper directory (default: %(default)s)")
    p.add_argument("--n", type=int, default=64, help="clips in the audio set (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent requests / batch size (default %(default)s)")
    p.add_argument("--language", default="en", help="for multilingual models (default %(default)s)")
    p.add_argument("--skip-http", action="store_true", help="no rill serve side")
    p.add_argument("--device", default="cpu", help="rill's and transformers' device: cpu | cuda (default cpu; the "
                   "HTTP and CTranslate2 sides run on the CPU only and are skipped elsewhere)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="rill's and transformers' weights (default float32)")
    p.add_argument("--admit-group", type=int, default=None,
                   help="rill's rows refilled together (SpeechCore admit_group; default: a quarter of "
                        "--concurrency)")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--skip-faster-whisper", action="store_true", help="no faster-whisper and no ctranslate2 side")


def model_dir_of(name: str) -> Path:
    from rill.speech.async_speech import resolve_speech_model

    directory = resolve_speech_model(name)
    if not (directory / "config.json").is_file():
        raise SystemExit(f"no Whisper model at {directory}: pass --model DIR")
    return directory


def model_language(model_dir: Path, language: str) -> str | None:
    """The language to ask for: English-only models take none (transformers refuses one)."""
    gen = json.loads((model_dir / "generation_config.json").read_text())
    return language if gen.get("is_multilingual") else None


# -- rill in process -----------------------------------------------------------------------------


def run_rill(model_dir: Path, clips: list[Clip], args, language: str | None) -> dict:
    from rill.speech.core import SpeechCore
    from rill.speech.decoding import TranscribeParams

    core = SpeechCore(str(model_dir), max_batch=args.concurrency, device=args.device, dtype=_dtype(args),
                      admit_group=args.admit_group)
    params = TranscribeParams(language=language)
    ids = (f"bench-{i}" for i in itertools.count())
    _drain(core, [clips[0]], params, ids, None)  # warm-up, not timed
    out = {}
    with progress(total=len(clips), desc="rill batch 1", disable=args.no_progress) as bar:
        t0 = time.perf_counter()
        texts = [_drain(core, [clip], params, ids, bar)[0] for clip in clips]
        out["batch1"] = score(clips, texts, time.perf_counter() - t0)
    with progress(total=len(clips), desc=f"rill {args.concurrency} rows", disable=args.no_progress) as bar:
        t0 = time.perf_counter()
        texts = _drain(core, clips, params, ids, bar)
        out["concurrent"] = score(clips, texts, time.perf_counter() - t0) | {"max_batch": args.concurrency,
                                                                           "admit_group": core.admit_group}
    return out


def _drain(core, clips: list[Clip], params, ids, bar) -> list[str]:
    """Add every clip, step until all finish; the texts in clip order."""
    request_ids = [next(ids) for _ in clips]
    for request_id, clip in zip(request_ids, clips):
        core.add_request(request_id, clip.audio, params)
    texts: dict[str, str] = {}
    max_steps = 2 * len(clips) * (core.runtime.config.max_target_positions + 1)
    for _ in range(max_steps):
        for delta in core.step():
            if delta.error is not None:
                raise RuntimeError(f"{delta.request_id} failed: {delta.error}")
            if delta.finished is not None:
                texts[delta.request_id] = delta.finished.text
                if bar is not None:
                    bar.update(1)
        if len(texts) == len(clips):
            return [texts[r] for r in request_ids]
    raise RuntimeError(f"rill did not finish {len(clips)} transcriptions in {max_steps} steps")


# -- rill over HTTP ------------------------------------------------------------------------------


def run_rill_http(model_dir: Path, clips: list[Clip], args, language: str | None) -> dict:
    import trio

    return trio.run(_serve_and_post, model_dir, clips, args, language)


async def _serve_and_post(model_dir: Path, clips: list[Clip], args, language: str | None) -> dict:
    import trio

    from rill.config import EngineConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    config = EngineConfig(model="rill-tiny", dtype="float32", kv_cache_bytes=32 << 20, seed=args.seed)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(), "127.0.0.1", 0, 1.0, speech_model=str(model_dir), shutdown_trigger=stop.wait,
            task_status=task_status))
        try:
            return await _post_all(binds[0], str(model_dir), clips, args, language)
        finally:
            stop.set()


async def _post_all(url: str, model: str, clips: list[Clip], args, language: str | None) -> dict:
    import httpx

    files = [(c.path.name, c.path.read_bytes()) for c in clips]  # read before the clock starts
    form = {"model": model, "response_format": "json"} | ({"language": language} if language else {})
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, limits=limits) as client:
        async def post(name_and_bytes) -> str:
            response = await client.post(f"{url}/v1/audio/transcriptions", data=form,
                                         files={"file": (*name_and_bytes, "audio/wav")})
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
            return response.json()["text"]

        await post(files[0])  # warm-up, not timed
        out = {}
        for mode, clients in (("batch1", 1), ("concurrent", args.concurrency)):
            with progress(total=len(files), desc=f"rill-http {clients} clients", disable=args.no_progress) as bar:
                t0 = time.perf_counter()
                texts = await _clients(post, files, clients, bar)
                out[mode] = score(clips, texts, time.perf_counter() - t0) | {"clients": clients}
    return out


async def _clients(post, files: list, clients: int, bar) -> list[str]:
    """`clients` tasks, each sending the next file as soon as its last answer came back."""
    import trio

    texts: list[str | None] = [None] * len(files)
    pending = iter(range(len(files)))

    async def client():
        for i in pending:  # shared: each index goes to exactly one client
            texts[i] = await post(files[i])
            bar.update(1)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    return texts


# -- transformers --------------------------------------------------------------------------------


def run_transformers(model_dir: Path, clips: list[Clip], args, language: str | None) -> dict:
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=_dtype(args)).to(args.device).eval()
    extractor = WhisperFeatureExtractor.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    kwargs = {"language": language, "task": "transcribe"} if language else {}

    def transcribe(batch: list[Clip]) -> list[str]:
        features = extractor([c.audio for c in batch], sampling_rate=16_000, return_tensors="pt").input_features
        with torch.inference_mode():
            out = model.generate(features.to(model.device, model.dtype), return_timestamps=False, **kwargs)
        return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]

    transcribe(clips[:1])  # warm-up, not timed
    out = {}
    for mode, size in (("batch1", 1), ("concurrent", args.concurrency)):
        texts = []
        t0 = time.perf_counter()
        for start in progress(range(0, len(clips), size), desc=f"transformers batch {size}", disable=args.no_progress):
            texts += transcribe(clips[start : start + size])
        out[mode] = score(clips, texts, time.perf_counter() - t0) | {"batch_size": size}
    return out


def _dtype(args):
    import torch

    return getattr(torch, args.dtype)


# -- CTranslate2 ---------------------------------------------------------------------------------


def run_ctranslate2_sides(model_dir: Path, clips: list[Clip], args, language: str | None) -> tuple[dict, dict, dict]:
    """(faster_whisper, ctranslate2, conversion): each side n/a with the reason when it cannot run."""
    import torch

    if (why := fasterwhisper.missing()) is not None:
        return _na(why), _na(why), {}
    threads = torch.get_num_threads()
    common = dict(language=language, threads=threads, concurrency=args.concurrency, disable=args.no_progress)
    with tempfile.TemporaryDirectory(prefix="rill-bench-ct2-") as tmp:
        ct2_dir, seconds = fasterwhisper.convert(model_dir, Path(tmp) / "ct2")
        conversion = {"converter": "ctranslate2.converters.TransformersConverter", "quantization": "float32",
                      "seconds": seconds}
        fw = fasterwhisper.run_faster_whisper(ct2_dir, model_dir, clips, **common)
        ct2 = fasterwhisper.run_ctranslate2(ct2_dir, model_dir, clips, **common)
    return fw, ct2, conversion


def _na(reason: str) -> dict:
    return {"status": "n/a", "reason": reason}


# -- the run -------------------------------------------------------------------------------------


def run(args) -> dict:
    if args.n < 1 or args.concurrency < 1:
        raise SystemExit("--n and --concurrency must be at least 1")
    model_dir = model_dir_of(args.model)
    language = model_language(model_dir, args.language)
    window_s = json.loads((model_dir / "preprocessor_config.json").read_text())["n_samples"] / 16_000
    root = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    clips = load_audio_set(root, args.seed, args.n, window_s, disable_progress=args.no_progress)
    sides: dict[str, dict] = {"rill": run_rill(model_dir, clips, args, language)}
    skipped = _na("skipped")
    cpu_only = _na(f"runs on the CPU only, not on --device {args.device}")
    on_cpu = args.device == "cpu"
    sides["rill_http"] = skipped if args.skip_http else cpu_only if not on_cpu else run_rill_http(
        model_dir, clips, args, language)
    sides["transformers"] = skipped if args.skip_transformers else run_transformers(model_dir, clips, args, language)
    conversion = {}
    if args.skip_faster_whisper or not on_cpu:
        sides["faster_whisper"] = sides["ctranslate2"] = skipped if args.skip_faster_whisper else cpu_only
    else:
        sides["faster_whisper"], sides["ctranslate2"], conversion = run_ctranslate2_sides(model_dir, clips, args,
                                                                                          language)
    _add_agreement(sides)
    return {
        "benchmark": NAME,
        "config": {"model": args.model, "model_dir": str(model_dir), "n": args.n, "concurrency": args.concurrency,
                   "language": language, "seed": args.seed, "device": args.device, "dtype": args.dtype},
        "audio": {"num_clips": len(clips), "audio_seconds": sum(c.seconds for c in clips),
                  "reference_words": sum(c.num_words for c in clips), "window_s": window_s,
                  "directory": str(clips[0].path.parent), "references": [c.text for c in clips]},
        "target_speedup": TARGET_SPEEDUP,
        "sides": sides,
        "ctranslate2_conversion": conversion,
        "speedups": _speedups(sides),
    }


def ok(side: dict) -> bool:
    return side.get("status", "ok") == "ok"


def _add_agreement(sides: dict) -> None:
    """Each side's share of transcripts equal to rill's (stripped text) in the same mode."""
    for side in sides.values():
        if not ok(side):
            continue
        for mode in MODES:
            mine, rills = side[mode]["texts"], sides["rill"][mode]["texts"]
            side[mode]["agree_with_rill"] = sum(a.strip() == b.strip() for a, b in zip(mine, rills)) / len(rills)


def _speedups(sides: dict) -> dict:
    """rill's (and rill-http's) speed over each other side's: their seconds / rill's, per mode."""
    out = {}
    for ours in ("rill", "rill_http"):
        for theirs in ("transformers", "faster_whisper", "ctranslate2"):
            if ok(sides[ours]) and ok(sides[theirs]):
                out[f"{ours}_vs_{theirs}"] = {m: sides[theirs][m]["seconds"] / sides[ours][m]["seconds"] for m in MODES}
    return out


# -- report --------------------------------------------------------------------------------------


def summary(result: dict) -> str:
    a, c = result["audio"], result["config"]
    lines = [f"transcribe, {a['num_clips']} clips ({a['audio_seconds']:.1f} s of audio, {a['reference_words']} words), "
             f"model {c['model']}, concurrency {c['concurrency']}, torch threads {result.get('torch_threads', '?')}:",
             "  side             batch 1: RTF   words/s  exact | concurrent: RTF   words/s  exact"]
    for name, side in result["sides"].items():
        if not ok(side):
            lines.append(f"  {name:15s}  n/a: {side['reason']}")
            continue
        cells = [f"{side[m]['rtf']:12.4f} {side[m]['words_per_s']:9.1f} {side[m]['exact']:6.0%}" for m in MODES]
        lines.append(f"  {name:15s} {cells[0]} | {cells[1]}")
    for key, value in result["speedups"].items():
        lines.append(f"  {key}: batch 1 {value['batch1']:.2f}x, concurrent {value['concurrent']:.2f}x")
    lines.append(f"  target: rill >= {result['target_speedup']}x transformers")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    import numpy as np

    names = list(result["sides"])
    concurrency = result["config"]["concurrency"]

    def draw(axes):
        x = np.arange(len(names))
        for ax, key, label in ((axes[0], "words_per_s", "words / s (higher is better)"),
                               (axes[1], "rtf", "real-time factor (lower is better)")):
            for offset, mode, text in ((-0.2, "batch1", "batch 1"), (0.2, "concurrent", f"{concurrency} concurrent")):
                values = [result["sides"][n][mode][key] if ok(result["sides"][n]) else 0.0 for n in names]
                bars = ax.bar(x + offset, values, width=0.4, label=text)
                ax.bar_label(bars, labels=[f"{v:.3g}" if v else "n/a" for v in values], fontsize=7)
            ax.set_xticks(x, [n.replace("_", "-") for n in names], rotation=20)
            ax.set_ylabel(label)
            ax.legend(fontsize=8)

    speedup = result["speedups"].get("rill_vs_transformers")
    title = f"rill bench transcribe: {Path(result['config']['model']).name}, {result['audio']['num_clips']} clips"
    if speedup:
        title += f"; rill / transformers {speedup['batch1']:.2f}x (batch 1), {speedup['concurrent']:.2f}x ({concurrency})"
    save_plot(path, draw, ncols=2, title=title)
