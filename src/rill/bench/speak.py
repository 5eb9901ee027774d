"""`rill bench speak`: speech out. Time to first audio and audio seconds made per second at 1, 8 and 16
concurrent requests, rill against the `kokoro` package's own KPipeline on the same random-weight
Kokoro directory; and, for the default voice (espeak-ng), first text piece to first audio when the
text streams in over WS /v1/audio/speech/stream.

What each side runs, per request (a text of two clauses, the same texts on both sides):
- rill: the text cut by rill.tts.clauses, the clauses handed to rill's speech-out worker
  (rill.tts.worker) with rill's Kokoro backend; the worker gives the backend the next clause of every
  request in one call (on CUDA one padded forward; on the CPU the backend decodes them one at a time,
  rill.tts.kokoro.backend says why), and each call's audio comes back as soon as the call ends.
- KPipeline: the same clauses' phonemes (made once, up front, by rill's G2P: libespeak-ng's IPA in
  Kokoro's alphabet) through `KPipeline.generate_from_tokens(phonemes, voice=<dir>/voices/<v>.pt)`,
  its phoneme-input path, on `KModel(config=<dir>/config.json, model=<dir>/<weights>.pth)`. The pipeline
  is built with lang_code "e" only because its English G2P (misaki + spaCy) would download a model;
  generate_from_tokens never calls a G2P. One KPipeline and one KModel serve N threads, one a client
  (KPipeline has no batching of its own; the threads overlap where torch releases the GIL).
Both sides run float32 on the CPU with the same torch thread count (--threads).

Figures: time to first audio (request start to its first clause's audio, p50/p95), audio seconds
made per wall second over the whole level (the throughput a server gives), and each request's
real-time factor (its wall time over its audio's length). Targets (issue 50): rill >= 2x KPipeline's
audio seconds per second at 16 concurrent; the default voice's first audio <= 150 ms after the first
text piece on 2 cores. Reported here, never asserted.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

from rill.bench.common import add_common_args, default_cache_dir, progress, save_plot
from rill.bench.speak_sides import KPipelineSide, rill_level, stream_level

NAME = "speak"
VOICE = "af_alloy"  # a voice make_random_kokoro_dir writes
WORDS = ("the morning train left the station late and nobody on the platform seemed to mind it much because "
         "the weather was kind the coffee was warm and the river below the bridge moved slowly past old houses "
         "where people were waking up to another quiet day of work and small talk and plans for the evening").split()


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--levels", default="1,8,16", help="concurrent requests (default %(default)s)")
    p.add_argument("--rounds", type=int, default=1, help="requests each client sends in turn (default %(default)s)")
    p.add_argument("--kokoro-shape", default="kokoro-82m", help="make_random_kokoro_dir's shape: kokoro-82m "
                   "(Kokoro-82M's own), or a smaller one for smoke tests (default %(default)s)")
    p.add_argument("--no-kpipeline", action="store_true", help="skip the kokoro package's side")
    p.add_argument("--streams", default="1,8,16", help="default voice: concurrent text streams (default %(default)s)")
    p.add_argument("--piece-ms", type=float, default=20.0,
                   help="default voice: one word of text every this many ms, as an LLM writes (default %(default)s)")


# -- the workload -----------------------------------------------------------------------------------------


def make_texts(n: int, seed: int, max_clauses: int = 2) -> list[str]:
    """n texts of two to max_clauses clauses of 4-8 words each, commas and full stops between them."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        clauses = []
        for k in range(rng.randint(2, max_clauses)):
            start = rng.randrange(len(WORDS) - 8)
            words = WORDS[start:start + rng.randint(4, 8)]
            clauses.append(" ".join(words).capitalize() if k == 0 else " ".join(words))
        texts.append(", ".join(clauses[:-1]) + ". " + clauses[-1].capitalize() + ".")
    return texts


# -- the run ---------------------------------------------------------------------------------------------


def _kokoro_dir(args) -> Path:
    from rill.tts.kokoro import make_random_kokoro_dir

    root = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    path = root / f"kokoro-{args.kokoro_shape}-seed{args.seed}"
    if not (path / "config.json").exists():  # made once; both sides load these files
        make_random_kokoro_dir(path, shape=args.kokoro_shape, seed=args.seed)
    return path


async def _rill_levels(backend, texts: list[str], levels: list[int], args) -> list[dict]:
    from rill.tts.worker import open_speech_out

    voice = backend.resolve_voice(VOICE)
    out_levels = []
    async with open_speech_out(backend) as out:
        await rill_level(out, texts, 1, 1, voice)  # warm-up: first calls allocate
        for n in progress(levels, desc="speak: rill", disable=args.no_progress):
            out_levels.append(await rill_level(out, texts, n, args.rounds, voice))
    return out_levels


def _kpipeline_levels(model_dir: Path, backend, texts: list[str], levels: list[int], args) -> list[dict]:
    from rill.tts.clauses import split_text

    side = KPipelineSide(model_dir, model_dir / "voices" / f"{VOICE}.pt")
    phonemes = [[backend.phonemize(clause, VOICE) for clause in split_text(text)] for text in texts]
    side.level(phonemes, 1, 1)  # warm-up
    return [side.level(phonemes, n, args.rounds) for n in progress(levels, desc="speak: KPipeline",
                                                                       disable=args.no_progress)]


async def _default_voice_streams(texts: list[str], args) -> list[dict]:
    import trio

    from rill.server import serve
    from rill.config import EngineConfig
    from rill.transports.http import ServerConfig

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            EngineConfig(model="rill-tiny"), ServerConfig(), "127.0.0.1", 0, 1.0, tts_model="espeak",
            shutdown_trigger=stop.wait, task_status=task_status))
        url = binds[0].replace("http://", "ws://") + "/v1/audio/speech/stream"
        try:
            await stream_level(url, texts, 1, args.piece_ms / 1000)  # warm-up
            return [await stream_level(url, texts, n, args.piece_ms / 1000)
                    for n in progress([int(s) for s in args.streams.split(",")], desc="speak: default voice",
                                      disable=args.no_progress)]
        finally:
            stop.set()


def run(args) -> dict:
    import trio

    from rill.tts.kokoro import load_kokoro_backend

    levels = [int(n) for n in args.levels.split(",")]
    texts = make_texts(max(levels) * args.rounds, args.seed)
    model_dir = _kokoro_dir(args)
    backend = load_kokoro_backend(model_dir)
    rill = trio.run(_rill_levels, backend, texts, levels, args)
    kpipeline = [] if args.no_kpipeline else _kpipeline_levels(model_dir, backend, texts, levels, args)
    streams = trio.run(_default_voice_streams, texts, args)
    return _result(rill, kpipeline, streams, texts, args)


def _result(rill: list[dict], kpipeline: list[dict], streams: list[dict], texts: list[str], args) -> dict:
    top = max(level["concurrent"] for level in rill)
    speedup = None
    if kpipeline:
        ours = next(lv for lv in rill if lv["concurrent"] == top)["audio_s_per_s"]
        theirs = next(lv for lv in kpipeline if lv["concurrent"] == top)["audio_s_per_s"]
        speedup = ours / theirs if theirs else None
    first_stream = streams[0]["first_audio_ms"].get("p50") if streams else None
    return {
        "config": {"kokoro_shape": args.kokoro_shape, "voice": VOICE, "levels": args.levels, "rounds": args.rounds,
                   "texts": len(texts), "mean_text_chars": statistics.fmean(len(t) for t in texts),
                   "piece_ms": args.piece_ms, "streams": args.streams},
        "rill": rill,
        "kpipeline": kpipeline,
        "default_voice_streams": streams,
        "speedup_at_top": speedup,
        "targets": {"speedup_at_16": 2.0, "default_voice_first_audio_ms": 150.0},
        "met": {"speedup": None if speedup is None else speedup >= 2.0,
                "default_voice_first_audio": None if first_stream is None else first_stream <= 150.0},
    }


def summary(result: dict) -> str:
    c = result["config"]
    fmt = lambda v: "n/a" if v is None else f"{v:.0f} ms"  # noqa: E731
    lines = [f"speak: random-weight Kokoro ({c['kokoro_shape']}), voice {c['voice']}, {c['rounds']} requests per "
             f"client, texts of {c['mean_text_chars']:.0f} characters; torch threads {result.get('torch_threads', '?')}"]
    for side in ("rill", "kpipeline"):
        for lv in result[side]:
            lines.append(f"  {side:9s} {lv['concurrent']:2d} concurrent: {lv['audio_s_per_s']:.2f} audio s/s, first "
                         f"audio p50 {fmt(lv['first_audio_ms'].get('p50'))} p95 {fmt(lv['first_audio_ms'].get('p95'))}"
                         f", RTF p50 {lv['rtf_p50']:.2f}")
    if result["speedup_at_top"] is not None:
        lines.append(f"  rill / KPipeline audio s/s at the top level: {result['speedup_at_top']:.2f}x (target >= 2x: "
                     f"{'met' if result['met']['speedup'] else 'missed'})")
    for s in result["default_voice_streams"]:
        lines.append(f"  default voice, {s['streams']} text streams: first text piece -> first audio p50 "
                     f"{fmt(s['first_audio_ms'].get('p50'))} p95 {fmt(s['first_audio_ms'].get('p95'))}; after the "
                     f"first clause's text p50 {fmt(s['after_first_clause_ms'].get('p50'))}")
    if result["met"]["default_voice_first_audio"] is not None:
        lines.append(f"  default voice first audio (1 stream) <= 150 ms: "
                     f"{'met' if result['met']['default_voice_first_audio'] else 'missed'}")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    def draw(axes):
        for side, marker in (("rill", "o"), ("kpipeline", "s")):
            levels = result[side]
            if levels:
                xs = [lv["concurrent"] for lv in levels]
                axes[0].plot(xs, [lv["audio_s_per_s"] for lv in levels], marker=marker, label=side)
                axes[1].plot(xs, [lv["first_audio_ms"].get("p50") or 0 for lv in levels], marker=marker, label=side)
        streams = result["default_voice_streams"]
        if streams:
            axes[1].plot([s["streams"] for s in streams], [s["first_audio_ms"].get("p50") or 0 for s in streams],
                         marker="^", label="default voice, streamed text")
        axes[1].axhline(150, color="grey", linestyle=":", label="150 ms")
        axes[0].set_xlabel("concurrent requests")
        axes[0].set_ylabel("audio seconds made per second")
        axes[1].set_xlabel("concurrent requests")
        axes[1].set_ylabel("time to first audio, ms (p50)")
        for ax in axes:
            ax.legend(fontsize=8)

    save_plot(Path(path), draw, ncols=2, title=f"rill bench speak: random-weight Kokoro ({result['config']['kokoro_shape']})"
              " and the default voice")
