"""MkDocs hook: the `rill` command-line reference, generated from the CLI's own argparse parsers.

A page that holds the marker line `<!-- rill-cli-reference -->` (under a level-2 heading) gets, in its
place, one level-3 section per subcommand (`rill serve`, then `rill bench throughput` a level below, ...)
with its usage and a table of its flags: each flag's default, its `RILL_*` environment variable where it
has one, and its help. The parsers are built the way `rill` builds them, so the page cannot drift from the
code. Environment variables are found by watching which `RILL_*` names the code reads while it defines
each flag; the build runs with those variables cleared, so the defaults shown are the code's own.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os

MARKER = "<!-- rill-cli-reference -->"


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


class _RecordingEnviron(dict):
    """A stand-in for os.environ that notes every RILL_* name the code looks up."""

    def __init__(self, base):
        super().__init__({k: v for k, v in base.items() if not k.startswith("RILL_")})
        self.asked: list[str] = []

    def _note(self, key):
        if isinstance(key, str) and key.startswith("RILL_") and key not in self.asked:
            self.asked.append(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def _env_names(action) -> set[str]:
    """The RILL_* names a flag's variable would have by the house rule: RILL_ + the flag or its dest."""
    names = {"RILL_" + action.dest.upper()}
    names |= {"RILL_" + o.lstrip("-").upper().replace("-", "_") for o in action.option_strings}
    return names


@contextlib.contextmanager
def _watching_env():
    """Attach to each argparse action the RILL_* variables the code reads for it.

    A helper may read several variables before it adds its flags: a name read is held until the flag
    it is named for arrives; a flag whose variable is named otherwise gets the one name read just
    before it was added."""
    saved_environ, saved_add = os.environ, argparse._ActionsContainer.add_argument
    recorder = _RecordingEnviron(saved_environ)
    pool: list[str] = []

    def add_argument(self, *args, **kwargs):
        action = saved_add(self, *args, **kwargs)
        fresh = list(recorder.asked)
        recorder.asked.clear()
        pool.extend(n for n in fresh if n not in pool)
        claimed = [n for n in pool if n in _env_names(action)]
        if not claimed and len(fresh) == 1:
            claimed = fresh
        action.rill_env = claimed
        pool[:] = [n for n in pool if n not in claimed]
        return action

    os.environ, argparse._ActionsContainer.add_argument = recorder, add_argument
    try:
        yield
    finally:
        os.environ, argparse._ActionsContainer.add_argument = saved_environ, saved_add


def _capture_parser(module_name: str) -> argparse.ArgumentParser:
    """Run a forwarded command's main([]) until it parses its arguments, and take that parser."""
    saved = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        importlib.import_module(module_name).main([])
    except _Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_args = saved
    raise RuntimeError(f"{module_name}.main([]) returned without parsing its arguments")


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(action) -> str:
    if action.nargs == 0:  # a switch: off unless given
        return ""
    if action.default in (None, "", argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _flag_rows(parser) -> list[str]:
    rows, formatter = [], parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.nargs != 0:
                name += f" `{action.metavar or action.dest.upper()}`"
        else:
            name = f"`{action.metavar or action.dest}` (positional)"
        if action.choices and not isinstance(action.choices, dict):
            choices = "one of " + ", ".join(f"`{c}`" for c in action.choices) + ". "
        else:
            choices = ""
        env = ", ".join(f"`{e}`" for e in getattr(action, "rill_env", []))
        help_text = formatter._expand_help(action) if action.help else ""  # fills in %(default)s
        rows.append(f"| {name} | {_cell(_default(action))} | {env} | {_cell(choices + help_text)} |")
    return rows


def _section(title: str, parser, summary: str | None, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{title}`", ""]
    if summary:
        lines += [_cell(summary[:1].upper() + summary[1:]) + ".", ""]
    usage = parser.format_usage().strip().removeprefix("usage: ")
    if usage.count("\n") < 4:  # a long one says no more than the table below
        lines += ["```text", usage, "```", ""]
    rows = _flag_rows(parser)
    if rows:
        lines += ["| flag | default | environment | what it does |", "|---|---|---|---|", *rows, ""]
    for name, sub, help_text in _subparsers(parser):
        lines += _section(f"{title} {name}", sub, help_text, min(depth + 1, 6))
    return lines


def render() -> str:
    with _watching_env():
        cli = importlib.import_module("rill.cli")
        main = cli.build_parser()
        lines = []
        for name, sub, help_text in _subparsers(main):
            if name in cli.FORWARDED:
                continue
            lines += _section(f"rill {name}", sub, help_text, 3)
        for name, module in cli.FORWARDED.items():
            parser = _capture_parser(module)
            lines += _section(f"rill {name}", parser, parser.description and parser.description.split("\n")[0], 3)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
