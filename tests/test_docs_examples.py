"""The docs site's runnable examples run as written (issue 54): the blocks marked `<!-- run -->` under
docs/ (tests/docs_examples.py), those that call a server against a live one serving rill-tiny, the
others in this process; where a page shows the output, the output must match."""

from __future__ import annotations

import pytest
import trio

from docs_examples import examples, run
from helpers_server import one_torch_thread, running_server  # noqa: F401 (one_torch_thread: a fixture)

EXAMPLES = examples()
LOCAL = [e for e in EXAMPLES if not e.needs_server]
SERVED = [e for e in EXAMPLES if e.needs_server]


def check(example, printed: str) -> None:
    if example.output is not None:
        assert printed.strip() == example.output.strip(), f"{example} printed:\n{printed}"


def test_the_docs_mark_a_handful_of_examples_runnable():
    assert len(LOCAL) >= 2 and len(SERVED) >= 3, [str(e) for e in EXAMPLES]
    assert any(e.output for e in LOCAL) and any(e.output for e in SERVED)


@pytest.mark.parametrize("example", LOCAL, ids=str)
def test_offline_example_runs_and_prints_what_the_page_shows(example):
    check(example, run(example))


async def test_server_examples_run_against_a_live_server_and_print_what_the_pages_show():
    failures = []
    async with running_server("rill-tiny") as server:
        for example in SERVED:
            try:
                check(example, await trio.to_thread.run_sync(run, example, server.url))
            except Exception as exc:  # every example is tried; the report names each that failed
                failures.append(f"{example}: {exc!r}")
    assert not failures, "\n".join(failures)
