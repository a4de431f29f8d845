"""The command-line reference (reference/cli.md), written at build time from gen-pipeline's own parsers.

MkDocs runs `on_files` (mkdocs.yml `hooks:`), which adds the page; `render()` needs only gen_pipeline, so
tests/test_docs_site.py checks the page names every flag of every subcommand without MkDocs installed.
Nothing here is typed by hand but the words for the flags gen-pipeline sets for itself (INTERNAL): a flag
added to a parser is in the reference at the next build.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from gen_pipeline.cli import build_parser, subcommands

PAGE = "reference/cli.md"

# Flags hidden from --help because gen-pipeline passes them to its own processes (or refuses them).
INTERNAL = {
    "--share": "set by `--workers K` on each claimer: K claimers split each server's capacity",
    "--parent-fd": "set by `--workers` on each claimer: the pipe that tells it its parent lives",
    "--metrics-worker": "set by `--workers K` on each claimer: its `worker` label in the metrics",
    "--shard": "the static shards of earlier versions: refused (exit 2), pointing to `--workers K` and `--shards V`",
}

INTRO = """# Command-line reference

Every subcommand and every flag, generated from the command's own parsers when these pages are built, so it
says what `gen-pipeline SUBCOMMAND --help` says. The guides explain what the flags are for.
"""


def _cell(text: str) -> str:
    """Text for a table cell: one line, and no character Markdown would read as markup (`<think>` is text)."""
    text = " ".join(text.split())
    for char, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(char, escaped)
    return text


def _names(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        if action.choices:
            metavar = " {" + ",".join(map(str, action.choices)) + "}"
        else:
            metavar = " " + str(action.metavar or action.dest.upper())
    return ", ".join(f"`{s}{metavar}`" for s in action.option_strings)


def _default(action: argparse.Action) -> str:
    value = action.default
    if action.required:
        return "required"
    if value in (None, False, "", argparse.SUPPRESS) or action.nargs == 0:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    formatter = parser._get_formatter()
    return _cell(formatter._expand_help(action))


def _table(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> list[str]:
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for action in actions:
        rows.append(f"| {_names(action)} | {_default(action)} | {_help(parser, action)} |")
    return rows


def _hidden(action: argparse.Action, shown_elsewhere: set[str]) -> str:
    """Words for a flag hidden from this subcommand's --help."""
    for name in action.option_strings:
        if name in INTERNAL:
            return INTERNAL[name]
    if set(action.option_strings) & shown_elsewhere:
        return "accepted so the command line can be `generate`'s; not used here"
    raise KeyError(f"{action.option_strings}: a hidden flag without words in docs/hooks/cli_reference.py INTERNAL")


def render_command(name: str, parser: argparse.ArgumentParser, shown_elsewhere: set[str]) -> list[str]:
    """The section for one subcommand: usage, then a table per argument group, then its hidden flags."""
    lines = [f"## gen-pipeline {name}", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    usage = _usage(parser)
    lines += ["```text", usage, "```", ""]
    hidden = []
    for group in parser._action_groups:
        shown = [a for a in group._group_actions if a.help != argparse.SUPPRESS and a.dest != "help"]
        hidden += [a for a in group._group_actions if a.help == argparse.SUPPRESS]
        if not shown:
            continue
        title = group.title or "options"
        lines += [f"### {title[0].upper()}{title[1:]}", ""]
        if group.description:
            lines += [_cell(group.description), ""]
        lines += [*_table(parser, shown), ""]
    if hidden:
        lines += ["### Not listed by --help", "", "| flag | meaning |", "|---|---|"]
        lines += [f"| {_names(a)} | {_hidden(a, shown_elsewhere)} |" for a in hidden]
        lines.append("")
    return lines


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage lines, wrapped at 100 columns whatever the terminal (the page is the same on every machine)."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_usage().removeprefix("usage: ").strip()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _visible_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def render() -> str:
    """The whole reference page, as Markdown."""
    top = build_parser()
    commands = subcommands()
    shown_elsewhere = set().union(*(_visible_flags(p) for p in commands.values()))
    lines = [INTRO]
    lines += ["| command | what it does |", "|---|---|"]
    helps = {a.dest: a.help for a in top._subparsers._group_actions[0]._choices_actions}  # type: ignore[union-attr]
    lines += [f"| [`{n}`](#gen-pipeline-{n}) | {_cell(helps.get(n) or '')} |" for n in commands]
    lines.append("")
    for name, parser in commands.items():
        lines += render_command(name, parser, shown_elsewhere)
    return "\n".join(lines)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
