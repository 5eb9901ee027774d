"""Where a push-to-talk commit's time goes on a causal recogniser (issue 56): `rill bench voice`'s manual turn,
with the speech worker's steps timed in the server.

    python benchmarks/voice-commit-steps.py --speech-model rill-tiny-causal --session conversation
    python benchmarks/voice-commit-steps.py --speech-model rill-tiny-causal --session transcription
    python benchmarks/voice-commit-steps.py --speech-model rill-tiny-causal --switch-interval 0.0005

The bench's own clips (`--n`, seed 0, the 5 s bound) and its own manual turn (`rill.bench.voice.one_turn`:
0.3 s of silence and the clip up to its last sound in 100 ms pieces at real time, then commit and
`response.create`), on the bench's own server (`rill serve` of rill-tiny and the speech model, in this
process). `--session transcription` runs the same turn in a transcription session (no chat model reading
the words as they come). For each turn: commit to `...transcription.completed` at the client, and the
worker steps that ran in that window (`rill.speech.causal.LiveStreams.step`, timed here). The commit's
instant on the server's clock is taken as the turn's close less the client's figure (the wire's share is
a fraction of a millisecond on 127.0.0.1). `--switch-interval` sets `sys.setswitchinterval` for the run
(Python's default is 0.005 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

STEPS: list[tuple[str, float, float]] = []


def _timed(cls, name: str, label: str) -> None:
    method = getattr(cls, name)

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            STEPS.append((label, start, time.perf_counter()))

    setattr(cls, name, timed)


async def measure(args) -> list[dict]:
    from rill.bench import voice
    from rill.bench.common import default_cache_dir
    from rill.bench.speech_set import load_audio_set

    if args.session == "transcription":
        conversation = voice.realtime_session
        voice.realtime_session = lambda url, settings: conversation(
            url, {"type": "transcription", "turn_detection": settings.get("turn_detection")})
    bench = argparse.Namespace(llm=args.llm, seed=0, speech_model=args.speech_model, speech_delay_ms=None,
                               speech_early_stop=True, silence_ms=500, max_tokens=24)
    clips = load_audio_set(default_cache_dir(), 0, args.n, 5.0)
    rows = []
    async with voice._server(bench, tts_model=None) as base:
        url = base.replace("http://", "ws://") + "/v1/realtime"
        for clip in clips:
            STEPS.clear()
            turn, _, _ = await voice.one_turn(url, clip, bench, manual=True)
            closes = [s for label, s, _ in STEPS if label == "close"]
            if turn.completed_s is None or not closes:
                rows.append({"text": clip.text, "commit_to_final_ms": None})
                continue
            total_s = turn.completed_s - turn.commit_s
            start = closes[-1] - total_s
            steps = [(1000 * (s - start), 1000 * (e - s)) for label, s, e in STEPS
                     if label == "step" and e > start and s < closes[-1]]
            rows.append({"text": clip.text, "commit_to_final_ms": 1000 * total_s,
                         "worker_busy_ms": sum(d for _, d in steps), "steps": steps,
                         "first_step_at_ms": steps[0][0] if steps else None})
            print(f"{1000 * total_s:6.1f} ms, worker busy {rows[-1]['worker_busy_ms']:5.1f} ms in {len(steps)} steps "
                  f"(first at {rows[-1]['first_step_at_ms'] or 0:.1f} ms): {clip.text}")
    return rows


def main(argv: list[str] | None = None) -> int:
    import torch
    import trio

    import rill.speech.causal as causal
    import rill.speech.causal_live as causal_live

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speech-model", default="rill-tiny-causal")
    p.add_argument("--llm", default="rill-tiny")
    p.add_argument("--session", choices=["conversation", "transcription"], default="conversation")
    p.add_argument("--switch-interval", type=float, default=None)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    torch.set_num_threads(1)
    _timed(causal.LiveStreams, "step", "step")
    _timed(causal_live.CausalLiveTranscriber, "_close_turn", "close")
    rows = trio.run(measure, args)
    done = [r for r in rows if r["commit_to_final_ms"] is not None]
    summary = {"commit_to_final_ms_p50": float(np.median([r["commit_to_final_ms"] for r in done])),
               "worker_busy_ms_p50": float(np.median([r["worker_busy_ms"] for r in done])),
               "first_step_at_ms_p50": float(np.median([r["first_step_at_ms"] for r in done
                                                        if r["first_step_at_ms"] is not None]))}
    print(f"{args.session}, switch interval {sys.getswitchinterval()} s: commit -> final p50 "
          f"{summary['commit_to_final_ms_p50']:.1f} ms, worker busy p50 {summary['worker_busy_ms_p50']:.1f} ms, "
          f"first step p50 {summary['first_step_at_ms_p50']:.1f} ms after the commit")
    if args.json:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)}, "summary": summary,
                                         "turns": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
