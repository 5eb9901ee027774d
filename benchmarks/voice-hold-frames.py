"""`rill bench voice` with the causal live path's turn-end hold set (issue 56): A/B of the cut last word.

    python benchmarks/voice-hold-frames.py 0  bench voice --speech-model rill-tiny-causal --n 8 --streams 8,16,24 \
        --spoken-sessions '' --threads 1 --json bench-results/voice-causal-hold-before.json
    python benchmarks/voice-hold-frames.py 12 bench voice ... --json bench-results/voice-causal-hold-after.json

The first argument is `rill.speech.causal_live.MAX_HOLD_FRAMES`: 0 ends a server-VAD turn at its step even
inside a word (the behaviour before the hold), 12 is the default. `--dump-turns` (before `bench`) prints each
concurrent turn's deltas with their arrival times, the spoken word ends and the lags matched to them.
"""

import sys

import rill.bench.voice as voice
import rill.speech.causal_live as causal_live
from rill.cli import main


def _dump_turns() -> None:
    word_lags = voice.word_lags

    def dumped(turn, start, ends):
        lags = word_lags(turn, start, ends)
        print("turn", [(round(at - start, 2), text) for at, text in turn.deltas],
              "word ends", [round(float(end) + voice.LEAD_S, 2) for end in ends],
              "lags", [round(float(lag), 2) for lag in lags])
        return lags

    voice.word_lags = dumped


if __name__ == "__main__":
    causal_live.MAX_HOLD_FRAMES = int(sys.argv.pop(1))
    if sys.argv[1] == "--dump-turns":
        sys.argv.pop(1)
        _dump_turns()
    sys.exit(main())
