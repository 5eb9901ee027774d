"""The docs site keeps up with the code (issue 54): every route the app serves is on the endpoints page, and
the command-line reference the site generates (docs/hooks/cli_reference.py) covers every `rill` subcommand
with its flags and their RILL_* variables. `mkdocs build --strict` itself runs in .ci/run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from rill.transports.http import create_app

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented(rule: str) -> str:
    """A route as the page writes it: /v1/models/<path:model> -> /v1/models/{model}."""
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def test_every_route_of_the_app_is_on_the_endpoints_page():
    page = (DOCS / "guide" / "endpoints.md").read_text()
    rules = {rule.rule for rule in create_app().url_map.iter_rules()}
    assets = {r for r in rules if r.startswith("/web/")}
    assert assets and "`GET /web/*`" in page  # the web page's files, one row
    missing = sorted(documented(r) for r in rules - assets if f" {documented(r)}`" not in page)
    assert missing == [], f"routes missing from docs/guide/endpoints.md: {missing}"


@pytest.fixture(scope="module")
def cli_reference():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference

        return cli_reference.render()
    finally:
        sys.path.remove(str(DOCS / "hooks"))


def test_the_cli_reference_has_every_subcommand(cli_reference):
    from rill.bench import build_parser as bench_parser
    from rill.cli import FORWARDED, build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices) | set(FORWARDED)
    benches = set(bench_parser()._subparsers._group_actions[0].choices)
    headings = set(re.findall(r"^#+ `rill ([\w -]+)`$", cli_reference, re.MULTILINE))
    assert commands <= headings and {f"bench {b}" for b in benches} <= headings


def test_the_cli_reference_gives_each_flag_its_default_and_variable(cli_reference):
    row = next(line for line in cli_reference.splitlines() if line.startswith("| `--max-num-seqs`"))
    assert "`256`" in row and "`RILL_MAX_NUM_SEQS`" in row
    row = next(line for line in cli_reference.splitlines() if line.startswith("| `--port`"))
    assert "`8000`" in row and "`RILL_PORT`" in row


def test_the_readme_links_only_to_files_that_exist():
    """mkdocs checks the site's links; the README sits outside the site, so its links are checked here."""
    root = DOCS.parent
    readme = (root / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert targets
    assert [t for t in targets if t and not (root / t).exists()] == []
