"""The engine from trio: a prompt streamed in pieces (as captions or speech-to-text would
arrive) is prefilled while it arrives; the answer starts one engine step after the last piece.

    python examples/streaming_session.py
"""

import time

import trio

from rill import EngineConfig, SamplingParams, open_engine


async def main() -> None:
    async with open_engine(EngineConfig(model="rill-tiny")) as engine:
        tok = engine.tokenizer
        prompt = tok.encode_chat([{"role": "user", "content": "Uppercase: the quick brown fox"}])
        recv = engine.open_session("captions-1", SamplingParams(temperature=0, max_tokens=64))
        for start in range(0, len(prompt), 4):  # four tokens at a time, 20 ms apart
            engine.append("captions-1", prompt[start:start + 4])
            await trio.sleep(0.02)
        finished = time.perf_counter()
        engine.finish("captions-1")
        first = None
        async with recv:
            async for delta in recv:
                first = first or time.perf_counter()
                print(delta.text, end="", flush=True)
        print(f"\nfirst token {1000 * (first - finished):.1f} ms after the last piece")


if __name__ == "__main__":
    trio.run(main)
