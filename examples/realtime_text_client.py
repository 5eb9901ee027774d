"""Stream text into rill's realtime WebSocket API as it is typed (or read), then print the answer
live. The text is prefilled while it arrives, so the answer starts about one engine step after
the last piece.

    rill serve                                   # /v1/realtime on port 8000
    echo "What is 17 + 25?" | python examples/realtime_text_client.py
    python examples/realtime_text_client.py notes.txt --chunk-chars 40 --delay-s 0.05
    python examples/realtime_text_client.py --url ws://127.0.0.1:8765 < question.txt   # rill serve --ws-port 8765
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import trio
from trio_websocket import open_websocket_url


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", help="text to send (default: stdin)")
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    p.add_argument("--api-key", default=os.environ.get("RILL_API_KEY"))
    p.add_argument("--instructions", default="")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--chunk-chars", type=int, default=16, help="characters per input_text_buffer.append")
    p.add_argument("--delay-s", type=float, default=0.0, help="pause between chunks, as a live source would")
    return p.parse_args()


def read_chunks(args: argparse.Namespace) -> list[str]:
    text = open(args.file, encoding="utf-8").read() if args.file else sys.stdin.read()
    text = text.strip()
    return [text[i:i + args.chunk_chars] for i in range(0, len(text), args.chunk_chars)]


async def send(ws, type_: str, **fields) -> None:
    await ws.send_message(json.dumps({"type": type_, **fields}))


async def print_answer(ws, sent_at: list[float]) -> None:
    first = None
    while True:
        event = json.loads(await ws.get_message())
        kind = event["type"]
        if kind in ("response.output_text.delta", "response.text.delta"):
            first = first or time.perf_counter()
            print(event["delta"], end="", flush=True)
        elif kind == "error":
            print(f"\n[error {event['error']['code']}] {event['error']['message']}", file=sys.stderr)
        elif kind == "response.done":
            usage = event["response"]["usage"]
            ttft = f"{1000 * (first - sent_at[0]):.0f} ms" if first and sent_at else "-"
            print(f"\n[{event['response']['status']}: {usage['input_tokens']} tokens in, {usage['output_tokens']} "
                  f"out; first token {ttft} after the last piece]", file=sys.stderr)
            return


async def main() -> None:
    args = parse_args()
    chunks = read_chunks(args)
    headers = [(b"authorization", f"Bearer {args.api_key}".encode())] if args.api_key else []
    async with open_websocket_url(args.url, extra_headers=headers) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await send(ws, "session.update", session={"instructions": args.instructions,
                                                  "max_response_output_tokens": args.max_tokens})
        sent_at: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(print_answer, ws, sent_at)
            for chunk in chunks:
                await send(ws, "input_text_buffer.append", delta=chunk)
                await trio.sleep(args.delay_s)
            await send(ws, "input_text_buffer.commit")
            await send(ws, "response.create")
            sent_at.append(time.perf_counter())


if __name__ == "__main__":
    trio.run(main)
