"""`rill bench turn-detection`: semantic_vad against server_vad on held-out spoken questions, streamed at
real-time pace over /v1/realtime into `rill serve` (rill-tiny-speech + rill-tiny by default), in this
process on 127.0.0.1.

Each question of `rill bench transcribe`'s held-out set (rill.bench.speech_set: espeak-ng, voices and
words never trained on) is said twice: whole, and cut mid-phrase (after a random word, at the
quietest 30 ms near that word's end) with `--pause-s` of silence before the rest. Each version goes
to a session with server_vad (`--silence-ms`, 500 by default) and to one with semantic_vad
(`--eagerness`), create_response off (only the turn ends are timed), the versions of one question
side by side under the same load.

Measured:
- false commits: an `input_audio_buffer.committed` that comes before the question was finished
  (before its last sound was sent): server_vad commits every pause longer than its silence;
- end of speech to commit: from the moment the question's last sound was sent to the first
  commit after it, p50 and p95;
- the chat model's end-of-turn probability on the same questions' texts, whole and cut where the
  audio was cut (the figure semantic_vad reads; rill.speech.semantic_vad), offline.

Targets (fixed before measuring, issue 49): semantic false commits no more than server_vad's, and
semantic end-of-speech-to-commit p50 at most 0.6x server_vad's. Reported, never asserted.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rill.bench.common import add_common_args, default_cache_dir, percentile, progress, save_plot
from rill.bench.speech_set import Clip, load_audio_set

NAME = "turn-detection"
RATE = 16_000
CHUNK_S = 0.1
LEAD_S = 0.3  # silence before each question
TAIL_S = 2.0  # silence sent past the longest wait before a session gives up on a commit (a busy CPU lags)
LOUD = 1e-3
TARGET_P50_RATIO = 0.6


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--llm", default="rill-tiny", help="the chat model that reads the words (default %(default)s)")
    p.add_argument("--speech-model", default="rill-tiny-speech", help="rill-tiny-speech or a Whisper directory")
    p.add_argument("--n", type=int, default=100, help="held-out questions (default %(default)s)")
    p.add_argument("--pause-s", type=float, default=1.0, help="the pause inside a cut question (default %(default)s)")
    p.add_argument("--silence-ms", type=int, default=500, help="server_vad's silence_duration_ms (default %(default)s)")
    p.add_argument("--eagerness", default="auto", choices=("low", "medium", "high", "auto"))
    p.add_argument("--streams", type=int, default=4, help="sessions at once (default %(default)s)")


# -- the spoken set -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    index: int  # the question's place in the set
    cut: bool
    text: str  # the reference transcript
    heard_first: str  # the words before the pause (cut) or all of them
    audio: np.ndarray  # 16 kHz, no lead silence
    speech_end_s: float  # the question's last sound, in `audio`


def sound_end_s(audio: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(audio) > LOUD)
    return (loud[-1] + 1) / RATE if len(loud) else 0.0


def cut_case(index: int, clip: Clip, voice_args: list[str], rng: random.Random, pause_s: float) -> Case | None:
    """The clip with a pause after a random word (not the last): espeak-ng says the words up to it
    again to find where that word ends, and the cut goes at the quietest 30 ms near there."""
    from rill.speech.audio import load_audio
    from rill.speech.vad import quietest_sample
    from rill.tiny_speech.transcripts import spoken_form

    words = spoken_form(clip.text).split()
    if len(words) < 2:
        return None
    k = rng.randrange(1, len(words))
    wav = subprocess.run(["espeak-ng", *voice_args, "--stdout", " ".join(words[:k])], capture_output=True,
                         check=True, timeout=20).stdout
    estimate = int(sound_end_s(load_audio(wav)) * RATE)
    audio = clip.audio
    search = audio[:min(len(audio), estimate + int(0.12 * RATE))]
    cut = quietest_sample(search, max(0, estimate - int(0.25 * RATE)))
    gap = np.zeros(int(pause_s * RATE), np.float32)
    joined = np.concatenate([audio[:cut], gap, audio[cut:]])
    return Case(index, True, clip.text, " ".join(words[:k]), joined, float(sound_end_s(joined)))


def make_cases(clips: list[Clip], voices: list[list[str]], args) -> list[Case]:
    rng = random.Random(args.seed)
    cases = []
    for i, (clip, voice) in enumerate(zip(progress(clips, desc="cut questions", disable=args.no_progress), voices)):
        cases.append(Case(i, False, clip.text, clip.text, clip.audio, float(sound_end_s(clip.audio))))
        cut = cut_case(i, clip, voice, rng, args.pause_s)
        if cut is not None:
            cases.append(cut)
    return cases


# -- sessions ------------------------------------------------------------------------------------------


def turn_detection(mode: str, args) -> dict:
    if mode == "server_vad":
        return {"type": "server_vad", "silence_duration_ms": args.silence_ms, "create_response": False}
    return {"type": "semantic_vad", "eagerness": args.eagerness, "create_response": False}


def longest_wait_s(mode: str, args) -> float:
    from rill.speech.semantic_vad import max_wait_ms

    return (args.silence_ms if mode == "server_vad" else max_wait_ms(args.eagerness)) / 1000


async def run_case(url: str, case: Case, mode: str, args) -> dict:
    """One version of a question in one session: commit times relative to the end of its speech."""
    import trio

    from rill.bench.voice import b64, session

    ws_cm, ws = await session(url, {"type": "realtime", "temperature": 0, "turn_detection": turn_detection(mode, args)})
    commits, transcripts = [], []
    audio = np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), case.audio])
    step = int(CHUNK_S * RATE)
    try:
        start = trio.current_time()
        end = start + LEAD_S + case.speech_end_s
        give_up = len(audio) / RATE + longest_wait_s(mode, args) + TAIL_S

        async def read() -> None:
            while True:
                event = json.loads(await ws.get_message())
                if event["type"] == "input_audio_buffer.committed":
                    commits.append(float(trio.current_time() - end))
                elif event["type"] == "conversation.item.input_audio_transcription.completed":
                    transcripts.append(event["transcript"])
                elif event["type"] == "error":
                    raise RuntimeError(f"error event: {event['error']}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            at = 0
            while at / RATE < give_up and not (commits and commits[-1] >= 0 and at >= len(audio)):
                await trio.sleep_until(start + (at + step) / RATE)  # a piece goes once it has been said
                piece = audio[at:at + step] if at < len(audio) else np.zeros(step, np.float32)
                await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": b64(piece)}))
                at += step
            with trio.move_on_after(0.5):  # the last transcript
                while len(transcripts) < len(commits):
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    finally:
        await ws_cm.__aexit__(None, None, None)
    after = [c for c in commits if c >= 0]
    return {"index": case.index, "cut": case.cut, "mode": mode, "text": case.text, "first_words": case.heard_first,
            "false_commits": sum(c < 0 for c in commits), "commit_s": after[0] if after else None,
            "commits_s": [round(c, 3) for c in commits], "transcripts": transcripts}


async def _serve_and_measure(cases: list[Case], args) -> list[dict]:
    import trio

    from rill.config import EngineConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    config = EngineConfig(model=args.llm, dtype="float32", seed=args.seed)
    stop = trio.Event()
    runs = [(case, mode) for case in cases for mode in ("server_vad", "semantic_vad")]
    results: list[dict] = []
    limiter = trio.CapacityLimiter(args.streams)
    bar = progress(total=len(runs), desc="turn detection", disable=args.no_progress)

    async def one(url: str, case: Case, mode: str) -> None:
        async with limiter:
            results.append(await run_case(url, case, mode, args))
            bar.update(1)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(), "127.0.0.1", 0, 1.0, speech_model=args.speech_model, shutdown_trigger=stop.wait,
            task_status=task_status))
        url = binds[0].replace("http://", "ws://") + "/v1/realtime"
        try:
            async with trio.open_nursery() as runners:
                for case, mode in runs:
                    runners.start_soon(one, url, case, mode)
        finally:
            stop.set()
    bar.close()
    return sorted(results, key=lambda r: (r["index"], r["cut"], r["mode"]))


# -- the chat model's reading, offline ----------------------------------------------------------------


def end_of_turn_probabilities(llm_name: str, cases: list[Case]) -> list[float]:
    """P(end of user turn | the words) for each case's words before its pause (the cut) or all of them."""
    from rill import LLM, SamplingParams

    with LLM(llm_name) as llm:
        tokenizer = llm.tokenizer
        prefix, suffix = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}]).split("\x00")
        eot = tokenizer.encode(suffix, add_special_tokens=False)[0]
        params = SamplingParams(temperature=0, max_tokens=1, logprobs=0, logit_bias={eot: 100.0})
        prompts = [tokenizer.encode(prefix + c.heard_first, add_special_tokens=False) for c in cases]
        return [math.exp(o.outputs[0].logprobs[0].logprob) for o in llm.generate(prompts, params)]


# -- the run ------------------------------------------------------------------------------------------------


def run(args) -> dict:
    import trio

    from rill.bench.voice import manifest_voices
    from rill.speech.async_speech import resolve_speech_model

    model_dir = resolve_speech_model(args.speech_model)
    window_s = json.loads((model_dir / "preprocessor_config.json").read_text())["n_samples"] / RATE
    root = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    clips = load_audio_set(root, args.seed, args.n, window_s, disable_progress=args.no_progress)
    cases = make_cases(clips, manifest_voices(clips), args)
    probabilities = end_of_turn_probabilities(args.llm, cases)
    runs = trio.run(_serve_and_measure, cases, args)
    return result(runs, cases, probabilities, args)


def _ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    ms = [1000 * s for s in seconds]
    return {"n": len(ms), "p50": round(percentile(ms, 50), 1), "p95": round(percentile(ms, 95), 1)}


def _side(runs: list[dict]) -> dict:
    latency = [r["commit_s"] for r in runs if r["commit_s"] is not None]
    out = {"runs": len(runs), "false_commits": sum(r["false_commits"] for r in runs),
           "runs_with_false_commit": sum(r["false_commits"] > 0 for r in runs),
           "no_commit": sum(r["commit_s"] is None for r in runs), "end_to_commit_ms": _ms(latency)}
    for name, cut in (("complete", False), ("cut", True)):
        part = [r for r in runs if r["cut"] is cut]
        out[name] = {"runs": len(part), "runs_with_false_commit": sum(r["false_commits"] > 0 for r in part),
                     "end_to_commit_ms": _ms([r["commit_s"] for r in part if r["commit_s"] is not None])}
    return out


def _probabilities(cases: list[Case], probabilities: list[float]) -> dict:
    out = {}
    for name, cut in (("complete", False), ("cut", True)):
        values = [p for c, p in zip(cases, probabilities) if c.cut is cut]
        out[name] = {q: round(percentile(values, q), 6) for q in (10, 25, 50, 75, 90)} if values else {}
    return out


def at_a_pause(runs: list[dict], max_wait_s: float) -> dict:
    """semantic_vad's commits that a pause made (the words read as finished), not its cap: how often,
    and how soon: what the detector costs when the model knows."""
    semantic = [r for r in runs if r["mode"] == "semantic_vad"]
    early = [r["commit_s"] for r in semantic if r["commit_s"] is not None and r["commit_s"] < max_wait_s]
    return {"share": round(len(early) / max(1, len(semantic)), 3), "end_to_commit_ms": _ms(early)}


def result(runs: list[dict], cases: list[Case], probabilities: list[float], args) -> dict:
    from rill.speech.semantic_vad import FINISHED_AT, level, max_wait_ms

    server = _side([r for r in runs if r["mode"] == "server_vad"])
    semantic = _side([r for r in runs if r["mode"] == "semantic_vad"])
    p50s = server["end_to_commit_ms"].get("p50"), semantic["end_to_commit_ms"].get("p50")
    ratio = p50s[1] / p50s[0] if None not in p50s and p50s[0] else None
    return {
        "config": {"llm": args.llm, "speech_model": str(args.speech_model), "questions": len({c.index for c in cases}),
                   "cases": len(cases), "pause_s": args.pause_s, "silence_ms": args.silence_ms,
                   "eagerness": args.eagerness, "finished_at": FINISHED_AT[level(args.eagerness)],
                   "max_wait_ms": max_wait_ms(args.eagerness), "streams": args.streams, "chunk_ms": CHUNK_S * 1000},
        "server_vad": server, "semantic_vad": semantic, "semantic_over_server_p50": ratio,
        "semantic_at_a_pause": at_a_pause(runs, max_wait_ms(args.eagerness) / 1000),
        "end_of_turn_probability": _probabilities(cases, probabilities),
        "targets": {"false_commits": "semantic <= server_vad", "p50_ratio": TARGET_P50_RATIO,
                    "false_commits_met": semantic["false_commits"] <= server["false_commits"],
                    "p50_met": ratio is not None and ratio <= TARGET_P50_RATIO},
        "runs": runs,
    }


def summary(result: dict) -> str:
    c, t = result["config"], result["targets"]
    fmt = lambda v: "n/a" if v is None else f"{v:.0f} ms"  # noqa: E731
    lines = [f"turn-detection: {c['questions']} questions ({c['cases']} versions: whole and cut with a "
             f"{c['pause_s']:g} s pause), {Path(c['speech_model']).name} + {Path(c['llm']).name}, {c['streams']} sessions at once"]
    for mode, label in (("server_vad", f"server_vad {c['silence_ms']} ms"),
                        ("semantic_vad", f"semantic_vad {c['eagerness']}")):
        s = result[mode]
        lines.append(f"  {label}: false commits {s['false_commits']} in {s['runs_with_false_commit']} of {s['runs']} "
                     f"runs (whole {s['complete']['runs_with_false_commit']}, "
                     f"cut {s['cut']['runs_with_false_commit']}), "
                     f"end of speech -> commit p50 {fmt(s['end_to_commit_ms'].get('p50'))} p95 "
                     f"{fmt(s['end_to_commit_ms'].get('p95'))}, no commit {s['no_commit']}")
    ratio = result["semantic_over_server_p50"]
    lines.append(f"  targets: false commits semantic <= server_vad: {'met' if t['false_commits_met'] else 'missed'}; "
                 f"p50 ratio {'n/a' if ratio is None else f'{ratio:.2f}'} (<= {t['p50_ratio']}): "
                 f"{'met' if t['p50_met'] else 'missed'}")
    early = result["semantic_at_a_pause"]
    lines.append(f"  semantic_vad commits at a pause (not the cap): {early['share']:.0%}, p50 "
                 f"{fmt(early['end_to_commit_ms'].get('p50'))}")
    p = result["end_of_turn_probability"]
    lines.append(f"  P(end of turn) p50: whole {p['complete'].get(50)}, cut {p['cut'].get(50)}")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    def draw(axes):
        modes = ["server_vad", "semantic_vad"]
        names = [f"server_vad {result['config']['silence_ms']} ms", f"semantic_vad {result['config']['eagerness']}"]
        x = np.arange(len(modes))
        for offset, key in ((-0.2, "p50"), (0.2, "p95")):
            values = [result[m]["end_to_commit_ms"].get(key) or 0 for m in modes]
            bars = axes[0].bar(x + offset, values, width=0.4, label=key)
            axes[0].bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8)
        axes[0].set_xticks(x, names)
        axes[0].set_ylabel("end of speech -> commit, ms")
        axes[0].legend(fontsize=8)
        for offset, part in ((-0.2, "complete"), (0.2, "cut")):
            values = [result[m][part]["runs_with_false_commit"] for m in modes]
            bars = axes[1].bar(x + offset, values, width=0.4, label=f"{part} questions")
            axes[1].bar_label(bars, fontsize=8)
        axes[1].set_xticks(x, names)
        axes[1].set_ylabel("runs with a false commit")
        axes[1].legend(fontsize=8)

    c = result["config"]
    save_plot(Path(path), draw, ncols=2, title=f"rill bench turn-detection: {c['questions']} held-out questions, "
              f"whole and cut ({c['pause_s']:g} s pause); {Path(c['llm']).name}")
