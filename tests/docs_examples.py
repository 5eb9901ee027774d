"""The docs' runnable examples (issue 54): fenced blocks in README.md and under docs/ marked with a
`<!-- run -->` line just above them. A block that names http://127.0.0.1:8000 is run against a live server
on another port; a fenced block right after it titled "Output" is what it must print.

    <!-- run -->
    ```python
    print(1 + 1)
    ```

    ```text title="Output"
    2
    ```

Python runs in this process (exec, stdout captured). A bash block whose lines are all `rill ...` commands
runs them through `rill.cli.main`, the console script's own entry point; any other bash block runs in
bash with this venv's bin/ first on PATH.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARKER = "<!-- run -->"
DOCS_URL = "http://127.0.0.1:8000"
FENCE = re.compile(r"^(`{3,})(\w*)(.*)$")


@dataclass(frozen=True)
class Example:
    page: str  # relative to docs/
    line: int  # the opening fence, 1-based
    lang: str
    code: str
    output: str | None  # what it must print, when the page shows it

    @property
    def needs_server(self) -> bool:
        return DOCS_URL in self.code or "127.0.0.1:8000" in self.code

    def __str__(self) -> str:
        return f"{os.path.normpath('docs/' + self.page)}:{self.line}"


def _block(lines: list[str], start: int) -> tuple[str, str, str, int]:
    """The fenced block opening at lines[start]: (lang, info after it, body, index after its closing fence)."""
    match = FENCE.match(lines[start].strip())
    assert match, f"line {start + 1}: {MARKER} must stand right above a fenced block"
    fence, lang, info = match.groups()
    end = start + 1
    while lines[end].strip() != fence:
        end += 1
    return lang, info, "\n".join(lines[start + 1:end]) + "\n", end + 1


def examples(docs: Path = DOCS) -> list[Example]:
    """Every runnable block on the site's pages and in the README (paths relative to docs/)."""
    found = []
    for path in [docs.parent / "README.md", *sorted(docs.rglob("*.md"))]:
        lines = path.read_text().split("\n")
        for i, line in enumerate(lines):
            if line.strip() != MARKER:
                continue
            lang, _, code, after = _block(lines, i + 1)
            while after < len(lines) and not lines[after].strip():
                after += 1
            output = None
            if after < len(lines) and FENCE.match(lines[after].strip()) and 'title="Output"' in lines[after]:
                output = _block(lines, after)[2]
            found.append(Example(os.path.relpath(path, docs), i + 2, lang, code, output))
    return found


def _rill_commands(code: str) -> list[list[str]] | None:
    lines = [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines or not all(line.startswith("rill ") for line in lines):
        return None
    return [shlex.split(line, comments=True) for line in lines]


def run(example: Example, url: str | None = None) -> str:
    """Run one example (against the server at `url` when it needs one) and return what it printed."""
    code = example.code
    if url:  # the page's address -> the live server's
        code = code.replace(DOCS_URL, url).replace("127.0.0.1:8000", url.split("//")[1])
    if example.lang == "python":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(example), "exec"), {"__name__": "__docs__"})
        return out.getvalue()
    assert example.lang in ("bash", "sh"), f"{example}: runnable blocks are python or bash"
    commands = _rill_commands(code)
    if commands:
        from rill.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for argv in commands:
                assert main(argv[1:]) == 0, f"{example}: {shlex.join(argv)} failed"
        return out.getvalue()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, f"{example}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout
