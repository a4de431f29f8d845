"""The hand-written docs keep up with the command line and run/: every flag is explained in a guide,
and run/README.md sorts every script (the generated CLI reference is tests/test_docs_site.py's)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gen_pipeline.cli import subcommands

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def hand_written() -> str:
    """Every page of the docs and the README (the generated reference is not among them)."""
    return "\n".join(p.read_text() for p in [REPO / "README.md", *DOCS.rglob("*.md")])


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_flag_is_explained_in_a_guide(command: str):
    """Each flag a subcommand's --help shows is named in a hand-written page, not only in the generated
    reference: what a flag is for, beyond its one line of help, has a place users find (the README's flag table
    did this for generate before the docs site; export --push-to-hub was documented nowhere)."""
    text = hand_written()
    flags = [
        s
        for a in subcommands()[command]._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
        if s.startswith("--") and s != "--help"
    ]
    missing = [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    assert not missing, f"no guide explains {command} {missing}"


def test_run_readme_lists_every_script_in_run():
    """run/README.md sorts every user script and piece of test infrastructure in run/, and the docs point to it."""
    run = REPO / "run"
    listed = (run / "README.md").read_text()
    skip = {"README.md", "slurm", "lib", "__pycache__"}
    entries = [p for p in run.iterdir() if p.name not in skip] + list((run / "slurm").iterdir())
    entries += list((run / "lib").iterdir())
    for entry in entries:
        name = entry.relative_to(run).as_posix() + ("/" if entry.is_dir() else "")
        assert f"`{name}`" in listed, f"run/README.md does not list {name}"
    assert "(llama/README.md)" in listed
    for page in ("reference/makefile.md", "development.md"):
        assert "run/README.md" in (DOCS / page).read_text(), f"docs/{page} does not point to run/README.md"
