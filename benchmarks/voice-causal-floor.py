"""The floor a causal recogniser's weights set on `rill bench voice`'s lag and commit figures (issue 56).

    python benchmarks/voice-causal-floor.py --speech-model rill-tiny-causal,/tmp/tc7/phase7a --n 16 \
        --json bench-results/voice-causal-floor.json

On the bench's own clips and word times (the same `--n`, `--seed` and clip bound as `rill bench voice`), each
Voxtral Realtime model's stream is run alone, with no server and no clock: the audio goes in as the bench's
client sends it (0.3 s of silence, then the clip, in 100 ms pieces, each when it has been said), and a word
counts as arrived with the piece after which the live path would release it (its last token written and the
next token a pad or a new word: rill.speech.causal_live's rule). The lags are the bench's own
(`word_lags`), so they are what the bench would measure if the server took no time at all: the part of
the figure that the model's delay, its tokens per word and the 80 ms frames set.

The commit: the clip up to its last sound in 100 ms pieces, then the end (as a push-to-talk turn, whose
client sends the commit with its last piece); the positions the stream runs from the last piece on against
those the whole recording runs (a position is one decoder forward, and the encoder's frame with it). That
ratio is the commit's floor in work.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def lags_and_tail(runtime, clip, ends: list[float], delay_ms: float | None) -> dict:
    from rill.bench import voice
    from rill.bench.voice_client import CHUNK_S, RATE, Turn
    from rill.speech.voxtral_realtime import VoxtralStream

    audio = np.concatenate([np.zeros(int(voice.LEAD_S * RATE), np.float32), clip.audio,
                            np.zeros(int(1.2 * RATE), np.float32)])
    stream = VoxtralStream(runtime, RATE, delay_ms=delay_ms, early_stop=True)
    turn, step = Turn(), int(CHUNK_S * RATE)
    held, count, tokens_per_word = "", 0, []  # the word being written, its tokens so far; each word's tokens
    for at in range(0, len(audio), step):
        sent = min(at + step, len(audio)) / RATE
        for piece in stream.feed(audio[at:at + step]).pieces:
            if not piece or piece[:1].isspace():  # the word in flight is whole
                if held.strip():
                    turn.deltas.append((sent, held))
                    tokens_per_word.append(count)
                held, count = "", 0
            held += piece
            count += bool(piece)
    said = audio[: int(round((voice.LEAD_S + voice.sound_end_s(clip.audio)) * RATE))]
    manual = VoxtralStream(runtime, RATE, delay_ms=delay_ms, early_stop=True)
    last = (len(said) - 1) // step * step  # the last piece is sent with the commit: its positions are the commit's too
    manual.feed(said[:last])
    before = manual.num_positions
    manual.feed(said[last:])
    manual.finish()
    whole = VoxtralStream(runtime, RATE, delay_ms=delay_ms, early_stop=True)
    whole.feed(clip.audio)
    whole.finish()
    return {"lags_s": voice.word_lags(turn, 0.0, ends), "tokens_per_word": tokens_per_word,
            "tail_positions": manual.num_positions - before, "whole_positions": whole.num_positions}


def main(argv: list[str] | None = None) -> int:
    from rill.bench import voice
    from rill.bench.common import default_cache_dir, percentile
    from rill.bench.speech_set import load_audio_set
    from rill.speech.async_speech import resolve_speech_model
    from rill.speech.voxtral_realtime import load_voxtral_realtime

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speech-model", required=True, help="comma list of Voxtral Realtime models")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clip-bound-s", type=float, default=5.0, help="the bench's bound (rill-tiny-speech's window)")
    p.add_argument("--delay-ms", type=float, default=None)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    clips = load_audio_set(default_cache_dir(), args.seed, args.n, args.clip_bound_s)
    ends = [voice.word_ends_s(c, v) for c, v in zip(clips, voice.manifest_voices(clips))]
    out = {"config": vars(args) | {"json": str(args.json)}, "models": []}
    for model in [m.strip() for m in args.speech_model.split(",") if m.strip()]:
        runtime = load_voxtral_realtime(resolve_speech_model(model))
        turns = [lags_and_tail(runtime, c, e, args.delay_ms) for c, e in zip(clips, ends)]
        lags = [lag for t in turns for lag in t["lags_s"]]
        ratios = [t["tail_positions"] / t["whole_positions"] for t in turns]
        words = [n for t in turns for n in t["tokens_per_word"]]
        # the lag of words written in one token: what the delay, the frames and the release rule cost alone
        single = [lag for t in turns for lag, n in zip(t["lags_s"], t["tokens_per_word"]) if n == 1]
        row = {"speech_model": model, "lag_floor_ms": {"p50": 1000 * percentile(lags, 50),
                                                     "p95": 1000 * percentile(lags, 95)},
               "lag_floor_one_token_words_ms": {"n": len(single), "p50": 1000 * percentile(single, 50),
                                                "p95": 1000 * percentile(single, 95)},
               "tail_over_whole_positions": {"p50": percentile(ratios, 50), "p95": percentile(ratios, 95)},
               "tokens_per_word": {"mean": float(np.mean(words)), "p95": percentile(words, 95)}, "turns": turns}
        out["models"].append(row)
        print(f"{model}: lag floor p50 {row['lag_floor_ms']['p50']:.0f} ms, p95 {row['lag_floor_ms']['p95']:.0f} ms; "
              f"one-token words p50 {row['lag_floor_one_token_words_ms']['p50']:.0f} ms; "
              f"commit tail / whole positions p50 {row['tail_over_whole_positions']['p50']:.2f}; "
              f"tokens a word {row['tokens_per_word']['mean']:.2f} (p95 {row['tokens_per_word']['p95']})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
