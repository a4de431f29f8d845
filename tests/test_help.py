"""--help as a user reads it: generate's flags in groups, and nothing written for the project's own checks."""

from __future__ import annotations

import argparse
import re

import pytest

from gen_pipeline.cli import main, subcommands
from gen_pipeline.cli.generate import GROUPS


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `gen-pipeline ARGV --help` prints."""
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def sections(text: str) -> dict[str, list[str]]:
    """A --help text's sections (title -> the long flags listed under it)."""
    found: dict[str, list[str]] = {}
    title = ""
    for line in text.splitlines():
        if re.fullmatch(r"[a-z][a-z -]*:", line):
            title = line[:-1]
            found[title] = []
        elif title and (flag := re.match(r"\s+(?:-\w, )?(--[a-z-]+)", line)):
            found[title].append(flag.group(1))
    return found


def test_generate_help_groups_its_flags(capsys):
    """generate --help shows its flags under at least six named groups, each where a user looks for it."""
    shown = sections(help_text(["generate"], capsys))
    groups = [t for t in shown if t in GROUPS]
    assert len(groups) >= 6, shown
    assert groups == [t for t in GROUPS if t in shown]  # in GROUPS order
    where = {flag: title for title, flags in shown.items() for flag in flags}
    expected = {
        "--input": "input and output",
        "--out": "input and output",
        "--max-tokens": "model and budget",
        "--tokenizer": "model and budget",
        "--temperature": "sampling",
        "--servers": "fleet",
        "--outage-timeout": "fleet",
        "--force": "resume and safety",
        "--workers": "scale-out",
        "--metrics-port": "observability",
        "--progress": "observability",
    }
    assert {flag: where.get(flag) for flag in expected} == expected
    assert set(shown.get("options", [])) <= {"--help", "--config"}  # nothing left ungrouped


def test_generate_help_lists_every_flag_once(capsys):
    """Grouping lost no flag: each visible flag of the parser appears once in --help."""
    parser = subcommands()["generate"]
    visible = [
        next(s for s in a.option_strings if s.startswith("--"))
        for a in parser._actions
        if a.option_strings and a.help is not argparse.SUPPRESS
    ]
    listed = [flag for flags in sections(help_text(["generate"], capsys)).values() for flag in flags]
    assert sorted(listed) == sorted(visible)


@pytest.mark.parametrize("argv", [[], *[[name] for name in subcommands()]])
def test_no_help_shows_internal_text(argv, capsys):
    """No --help shows the import rules written for tests/test_imports.py (gen-pipeline --help ended with
    "May import: anything ...")."""
    text = help_text(argv, capsys)
    assert "May import" not in text and "tests/" not in text


def test_top_level_help_keeps_the_exit_codes(capsys):
    """gen-pipeline --help still documents the exit codes, the text around the dropped rule."""
    text = help_text([], capsys)
    assert "130 interrupted" in text and "resumable directory" in text


def test_subcommands_walks_every_parser():
    """subcommands() gives every subcommand's parser with its flags (for a generated CLI reference)."""
    parsers = subcommands()
    assert {"generate", "check", "export", "status", "report", "prepare", "simulate"} <= parsers.keys()
    assert any("--max-tokens" in a.option_strings for a in parsers["check"]._actions)
