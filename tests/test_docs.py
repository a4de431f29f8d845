"""The README's flag table states the defaults the command line has."""

from __future__ import annotations

import re
from pathlib import Path

from gen_pipeline.cli import build_parser
from gen_pipeline.config import DEFAULT_CONCURRENCY

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_defaults() -> dict[str, str]:
    """Flag -> the default column of the README's `generate` flag table (backticks dropped)."""
    table = README.read_text().split("## `gen-pipeline generate` flags", 1)[1].split("\n\n", 2)[1]
    cells = {}
    for line in table.splitlines():
        parts = [p.strip() for p in line.strip("|").split("|")]
        flags = re.findall(r"`(--[a-z-]+)", parts[0])
        for flag in flags:
            cells[flag] = parts[1].replace("`", "")
    return cells


def test_readme_defaults_are_the_parsers():
    """Every generate flag with a default shows that default in the README (numbers as written)."""
    sub = build_parser("generate")._subparsers._group_actions[0].choices["generate"]  # type: ignore[union-attr]
    cells = readme_defaults()
    for action in sub._actions:
        flag = next((s for s in action.option_strings if s.startswith("--")), None)
        if flag in (None, "--help") or action.default in (None, False) or flag not in cells:
            continue
        value = action.default
        text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        assert text in cells[flag], f"{flag}: README says {cells[flag]!r}, the parser {text!r}"


def test_readme_concurrency_default_is_the_servers_own():
    """--concurrency defaults to each server's max_running_requests, else DEFAULT_CONCURRENCY."""
    cell = readme_defaults()["--concurrency"]
    assert "max_running_requests" in cell and str(DEFAULT_CONCURRENCY) in cell


def test_run_readme_lists_every_script_in_run():
    """run/README.md sorts every user script and piece of test infrastructure in run/, and README points to it."""
    run = README.parent / "run"
    listed = (run / "README.md").read_text()
    skip = {"README.md", "slurm", "lib", "__pycache__"}
    entries = [p for p in run.iterdir() if p.name not in skip] + list((run / "slurm").iterdir())
    entries += list((run / "lib").iterdir())
    for entry in entries:
        name = entry.relative_to(run).as_posix() + ("/" if entry.is_dir() else "")
        assert f"`{name}`" in listed, f"run/README.md does not list {name}"
    assert "(llama/README.md)" in listed
    readme = README.read_text()
    for section in ("## Makefile", "## Tests against a real inference server"):
        body = readme.split(section, 1)[1].split("\n## ", 1)[0]
        assert "run/README.md" in body, f"README's {section!r} section does not point to run/README.md"
