"""`rill bench voice`'s report: what was measured (rill.bench.voice) as one block per speech model, the
summary lines and the PNG, the models side by side (one colour each) against their targets.

A block's figures: exact-transcript share (the lag is only meaningful where the transcript is right, so
the lag over exact turns alone is given too), transcript lag p50 / p95, end of speech to the first answer
token (server VAD, push-to-talk, transcribe-then-chat), a push-to-talk commit to its final transcript
against transcribing the whole recording, and the stream sweep. With one model the result keeps the shape
it had before models were compared: the first model's block is also spread at the top level.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from rill.bench import voice_spoken
from rill.bench.common import percentile, save_plot

# DESIGN.md's figures for the Whisper live path, and issue 56's for a causal recogniser
TARGETS = {"lag_p50_ms": 500, "manual_vs_baseline": 0.2, "vad_over_silence_ms": 150, "streams": 8}
CAUSAL_TARGETS = {"lag_p50_ms": 300, "lag_p95_ms": 600, "commit_vs_whole": 0.2, "streams": 24}
SPOKEN_TARGETS = {"spoken_p50_ms": 300, "spoken_vs_cascade": 0.2, "sessions": 8}


def ms(seconds: list[float]) -> dict:
    """n / p50 / p95 / mean in ms of the finite values (`missing`: how many were nan: never came)."""
    kept = [1000 * s for s in seconds if s == s]
    out = {"n": len(kept)}
    if len(kept) < len(seconds):
        out["missing"] = len(seconds) - len(kept)
    if kept:
        out.update(p50=percentile(kept, 50), p95=percentile(kept, 95), mean=statistics.fmean(kept))
    return out


def model_block(m: dict, causal: bool, silence_s: float) -> dict:
    """One model's figures from its turns (rill.bench.voice._listen)."""
    exact_lags = [lag for turn in m["vad"] if turn["exact"] for lag in turn["lags_s"]]
    first = {"server_vad": _p50(t["first_token_s"] for t in m["vad"]),
             "manual_commit": _p50(t["first_token_s"] for t in m["manual"]),
             "baseline_transcribe_then_chat": _p50(t["first_token_s"] for t in m["baseline"])}
    first["server_vad_less_silence"] = None if first["server_vad"] is None else first["server_vad"] - 1000 * silence_s
    commit = ms([t["commit_to_final_s"] for t in m["manual"]])
    whole = ms([t["transcribe_s"] for t in m["baseline"]])
    kept = [s["streams"] for s in m["streams"] if s["keeps_up"]]
    return {
        "speech_model": m["speech_model"], "causal": causal,
        "exact_transcripts": sum(t["exact"] for t in m["vad"]) / len(m["vad"]),
        "transcript_lag_ms": ms([lag for turn in m["vad"] for lag in turn["lags_s"]]),
        "transcript_lag_exact_ms": ms(exact_lags),
        "first_token_ms": first,
        "commit_to_final_ms": commit, "whole_recording_ms": whole,
        "commit_vs_whole": commit["p50"] / whole["p50"] if "p50" in commit and whole.get("p50") else None,
        "concurrency": m["streams"], "max_streams_kept_up": max(kept) if kept else None,
        "errors": dict(Counter(e for t in m["vad"] + m["manual"] for e in t["errors"])),
        "turns": m["vad"], "manual_turns": m["manual"], "baseline_turns": m["baseline"],
    }


def result(measured: dict, config: dict, silence_s: float) -> dict:
    blocks = [model_block(m, causal, silence_s) for m, causal in zip(measured["models"], config["causal"])]
    first = {k: v for k, v in blocks[0].items() if k not in ("speech_model", "causal")}
    return {"config": config, **first, "models": blocks, "spoken_answer": measured.get("spoken"),
            "targets": {**TARGETS, "causal": CAUSAL_TARGETS}}


def spoken_result(measured: dict, config: dict) -> dict:
    return {"config": config, "spoken_answer": measured["spoken"], "targets": SPOKEN_TARGETS}


def _p50(seconds) -> float | None:
    return ms(list(seconds)).get("p50")


# -- summary ----------------------------------------------------------------------------------------------


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def model_lines(block: dict, silence_ms: int) -> list[str]:
    lag, first = block["transcript_lag_ms"], block["first_token_ms"]
    t = CAUSAL_TARGETS if block["causal"] else TARGETS
    kind = "causal" if block["causal"] else "Whisper live path"
    lag_target = (f"target p50 <= {t['lag_p50_ms']} ms, p95 <= {t['lag_p95_ms']} ms" if block["causal"]
                  else f"target p50 < {t['lag_p50_ms']} ms")
    exact_lag = block["transcript_lag_exact_ms"]
    errors = ", ".join(f"{n} {code}" for code, n in block["errors"].items())
    lines = [f"  {block['speech_model']} ({kind}): exact transcripts {block['exact_transcripts']:.0%}"
             + (f"; error events: {errors}" if errors else ""),
             f"    transcript lag: p50 {_fmt(lag.get('p50'))}, p95 {_fmt(lag.get('p95'))} over {lag['n']} words; "
             f"exact turns only p50 {_fmt(exact_lag.get('p50'))}, p95 {_fmt(exact_lag.get('p95'))} ({lag_target})",
             f"    end of speech -> first answer token (p50): server VAD {_fmt(first['server_vad'])} "
             f"({_fmt(first['server_vad_less_silence'])} past the {silence_ms} ms silence; target < 150 ms), manual "
             f"commit {_fmt(first['manual_commit'])}, transcribe-then-chat {_fmt(first['baseline_transcribe_then_chat'])}"]
    if first["manual_commit"] and first["baseline_transcribe_then_chat"]:
        lines.append(f"    manual commit / baseline (first token): "
                     f"{first['manual_commit'] / first['baseline_transcribe_then_chat']:.2f} (target <= 0.2)")
    commit, whole, ratio = block["commit_to_final_ms"], block["whole_recording_ms"], block["commit_vs_whole"]
    lines.append(f"    manual commit -> final transcript p50 {_fmt(commit.get('p50'))} (p95 {_fmt(commit.get('p95'))}"
                 f"{', ' + str(commit['missing']) + ' never came' if commit.get('missing') else ''}), transcribing "
                 f"the whole recording p50 {_fmt(whole.get('p50'))}: "
                 + (f"{ratio:.2f} (target <= 0.2)" if ratio is not None else "n/a"))
    for s in block["concurrency"]:
        unfinished = f", {s['unfinished']} turns unfinished" if s.get("unfinished") else ""
        if s.get("empty"):
            unfinished += f" ({s['empty']} of them with no words)"
        lines.append(f"    {s['streams']} streams: lag p50 {_fmt(s['lag_ms'].get('p50'))} p95 "
                     f"{_fmt(s['lag_ms'].get('p95'))}, final transcript after the VAD's end p95 "
                     f"{_fmt(s['final_after_vad_end_ms'].get('p95'))}{unfinished}: "
                     f"{'keeps up' if s['keeps_up'] else 'falls behind'}")
    lines.append(f"    most streams kept up: {block['max_streams_kept_up'] or 'none'} (target {t['streams']})")
    return lines


def summary(result: dict) -> str:
    c = result["config"]
    if "first_token_ms" not in result:  # --spoken-only
        lines = [f"voice (spoken half): {c['n']} questions, {c['speech_model']} + {c['llm']}, server VAD silence "
                 f"{c['silence_ms']} ms, torch threads {result.get('torch_threads', '?')}"]
        for voice, spoken in result["spoken_answer"].items():
            lines += voice_spoken.summary_lines(spoken, voice)
        return "\n".join(lines)
    lines = [f"voice: {c['n']} questions (clips up to {c.get('clip_bound_s', 30):.0f} s), {c['speech_model']} + "
             f"{c['llm']}, server VAD silence {c['silence_ms']} ms, torch threads {result.get('torch_threads', '?')}"]
    for block in result["models"]:
        lines += model_lines(block, c["silence_ms"])
    for voice, spoken in (result.get("spoken_answer") or {}).items():
        lines += voice_spoken.summary_lines(spoken, voice)
    return "\n".join(lines)


# -- the PNG -----------------------------------------------------------------------------------------------


def plot(result: dict, path) -> None:
    spoken = result.get("spoken_answer") or {}
    if "first_token_ms" not in result:  # --spoken-only
        save_plot(Path(path), lambda axes: _plot_spoken(axes[0], spoken), ncols=1,
                  title=f"rill bench voice: spoken answers ({result['config']['llm']})")
        return

    def draw(axes):
        _plot_times(axes[0], result["models"])
        _plot_streams(axes[1], result["models"])
        if spoken:
            _plot_spoken(axes[2], spoken)

    names = " vs ".join(Path(b["speech_model"]).name for b in result["models"])
    save_plot(Path(path), draw, ncols=3 if spoken else 2, title=f"rill bench voice: {names} + {result['config']['llm']}")


def _label(block: dict) -> str:
    return f"{Path(block['speech_model']).name} (exact {block['exact_transcripts']:.0%})"


def _plot_times(ax, blocks: list[dict]) -> None:
    """p50 ms from the end of speech: first answer token three ways, and push-to-talk's final transcript
    beside the whole recording's; one colour per model."""
    rows = [("VAD -> token", lambda b: b["first_token_ms"]["server_vad"]),
            ("commit -> token", lambda b: b["first_token_ms"]["manual_commit"]),
            ("transcribe+chat", lambda b: b["first_token_ms"]["baseline_transcribe_then_chat"]),
            ("commit -> final", lambda b: b["commit_to_final_ms"].get("p50")),
            ("whole recording", lambda b: b["whole_recording_ms"].get("p50"))]
    width = 0.8 / len(blocks)
    for k, block in enumerate(blocks):
        values = [get(block) or 0 for _, get in rows]
        at = [i + k * width for i in range(len(rows))]
        bars = ax.bar(at, values, width, color=f"C{k}", label=_label(block))
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=6)
        # the target over each push-to-talk bar: 1/5 of its baseline (transcribe+chat; the whole recording)
        ax.hlines([values[2] / 5, values[4] / 5], [at[1] - width / 2, at[3] - width / 2],
                  [at[1] + width / 2, at[3] + width / 2], colors="black", linewidth=2,
                  label="target: 1/5 of its baseline" if k == 0 else None)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [name for name, _ in rows], fontsize=7)
    ax.set_ylabel("ms from the end of speech (p50)")
    ax.legend(fontsize=7)


def _plot_streams(ax, blocks: list[dict]) -> None:
    """Lag p50 (solid) and p95 (dashed) against concurrent streams, one colour per model; the targets."""
    for k, block in enumerate(blocks):
        streams = [s["streams"] for s in block["concurrency"]]
        for key, style in (("p50", "-"), ("p95", "--")):
            ax.plot(streams, [s["lag_ms"].get(key) or 0 for s in block["concurrency"]], style, marker="o",
                    color=f"C{k}", label=f"{Path(block['speech_model']).name} lag {key}")
        behind = [s["streams"] for s in block["concurrency"] if not s["keeps_up"]]
        if behind:
            ax.axvline(behind[0], color=f"C{k}", linestyle=":", alpha=0.6)
    ax.axhline(TARGETS["lag_p50_ms"], color="grey", linestyle=":", label="Whisper p50 target")
    if any(b["causal"] for b in blocks):
        ax.axhline(CAUSAL_TARGETS["lag_p50_ms"], color="black", linestyle=":", label="causal p50 target")
        ax.axhline(CAUSAL_TARGETS["lag_p95_ms"], color="black", linestyle="-.", label="causal p95 target")
        ax.axvline(CAUSAL_TARGETS["streams"], color="black", linestyle=":", alpha=0.3, label="causal streams target")
    ax.set_xlabel("concurrent real-time streams (dotted: the first that falls behind)")
    ax.set_ylabel("transcript lag, ms")
    ax.legend(fontsize=6)


def _plot_spoken(ax, spoken: dict) -> None:
    """End of speech to the first spoken byte (p50) per voice: push-to-talk, server VAD sessions, the cascade."""
    voices = list(spoken)
    rows = [("push-to-talk", lambda s: s["manual_commit"].get("p50"))]
    rows += [(f"VAD x{n['sessions']}", lambda s, k=k: s["sessions"][k].get("p50"))
             for k, n in enumerate(spoken[voices[0]]["sessions"])]
    rows.append(("cascade", lambda s: s["cascade"].get("p50")))
    width = 0.8 / len(rows)
    for k, (label, get) in enumerate(rows):
        values = [get(spoken[v]) or 0 for v in voices]
        bars = ax.bar([i + k * width for i in range(len(voices))], values, width, label=label)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(voices))], voices)
    ax.axhline(300, color="grey", linestyle=":", label="300 ms")
    shown = [v for label, get in rows for v in (get(spoken[name]) for name in voices) if v]
    if shown and max(shown) > 20 * min(shown):  # a neural voice on CPU beside espeak-ng: seconds beside ms
        ax.set_yscale("log")
    ax.set_ylabel("end of speech -> first spoken byte, ms (p50)")
    ax.legend(fontsize=7)
