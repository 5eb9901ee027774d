"""Write rill_tiny_arithmetic.jsonl: held-out sums and differences for rill-tiny, as lm-evaluation-
harness multiple-choice rows scored by loglikelihood (echo with logprobs on /v1/completions).

    python examples/lm_eval/make_dataset.py

Each context is the chat prompt rill-tiny was trained on plus its worked column steps, up to the
result; the choices are the result and three near misses (one, ten and a hundred too high).
The operand pairs are from rill-tiny's evaluation split, which training never saw.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rill.assets import RILL_TINY_DIR
from rill.tiny import splits
from rill.tiny.tasks import arithmetic_answer
from rill.tokenizer import Tokenizer

NUM_ROWS_PER_OP = 10
OUT = Path(__file__).with_name("rill_tiny_arithmetic.jsonl")


def row(tokenizer: Tokenizer, a: int, b: int, sign: str, rng: random.Random) -> dict:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} {sign} {b}?"}],
                                           add_generation_prompt=True)
    answer = arithmetic_answer(a, b, sign)
    steps, result = answer.rsplit(" = ", 1)  # "..., 3+0+1=4. 347 + 58" and "405"
    value = int(result)
    # " = " is one token of rill-tiny's: a context ending inside it ("... 58 =") would split the
    # token the model writes, and lm-evaluation-harness moves a context's trailing space into the
    # choice anyway. So the context stops before it and every choice starts with it.
    choices = [f" = {value + d}" for d in (0, 1, 10, 100)]
    order = list(range(len(choices)))
    rng.shuffle(order)
    return {"context": prompt + steps, "choices": [choices[i] for i in order], "label": order.index(0)}


def main() -> None:
    tokenizer = Tokenizer.from_dir(RILL_TINY_DIR)
    rng = random.Random(29)
    rows = []
    for sign, ordered in (("+", False), ("-", True)):
        for _ in range(NUM_ROWS_PER_OP):
            a, b = splits.sample_pair(rng, splits.EVAL, ordered=ordered)
            rows.append(row(tokenizer, a, b, sign, rng))
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {OUT}")


if __name__ == "__main__":
    main()
