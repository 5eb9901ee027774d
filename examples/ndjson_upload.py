"""Mode A: upload a text file to rill as one NDJSON request, a line per chunk, and print the answer
as it streams. rill prefills each line as it arrives, so the answer starts about one engine step
after the upload ends.

    rill serve &
    python examples/ndjson_upload.py README.md "Summarise this document in one sentence."

The request's last user message holds the instruction; the file's text extends it (the chat rule).
The body's end is the end of input, so no end_of_input line is needed.
"""

import argparse
import json
import sys
import time

import httpx


def body(path: str, instruction: str, max_tokens: int):
    request = {"messages": [{"role": "user", "content": instruction + "\n\n"}], "max_tokens": max_tokens,
               "stream": True}
    yield json.dumps(request).encode() + b"\n"
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.dumps({"payload": line}).encode() + b"\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="a text file")
    p.add_argument("instruction", nargs="?", default="Summarise this document in one sentence.")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    headers = {"Content-Type": "application/x-ndjson"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    started = time.perf_counter()
    first = None
    with httpx.Client(base_url=args.url, timeout=None) as client:
        lines = body(args.path, args.instruction, args.max_tokens)
        with client.stream("POST", "/v1/chat/completions", content=lines, headers=headers) as response:
            if response.status_code != 200:
                print(f"HTTP {response.status_code}: {response.read().decode()}", file=sys.stderr)
                return 1
            for line in response.iter_lines():
                if line.startswith("event: error"):
                    print("\n[the server reported an error]", file=sys.stderr)
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    print(f"\n{chunk['error']['message']}", file=sys.stderr)
                    return 1
                text = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                if text:
                    first = first or time.perf_counter()
                    print(text, end="", flush=True)
    if first is not None:
        print(f"\n[first token {1000 * (first - started):.0f} ms after the upload began]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
