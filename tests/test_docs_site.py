"""The docs site (docs/, mkdocs.yml): its generated CLI reference is complete, and no page points outside the
repository. `make docs` (in CI) builds it with --strict, which checks every link and the nav."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from gen_pipeline.cli import subcommands

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def cli_reference() -> ModuleType:
    """docs/hooks/cli_reference.py, the MkDocs hook that writes reference/cli.md."""
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_names_every_flag_of_every_subcommand():
    """Each option string of each subcommand, hidden ones too, is in its subcommand's section of the page."""
    hook = cli_reference()
    page = hook.render()
    commands = subcommands()
    assert set(commands) >= {"generate", "simulate", "prepare", "export", "check", "status", "report"}
    for name, parser in commands.items():
        section = page.split(f"\n## gen-pipeline {name}\n", 1)[1].split("\n## gen-pipeline ", 1)[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for flag in names:
                assert f"`{flag}" in section, f"gen-pipeline {name} {flag} is not in the CLI reference"


def test_the_cli_reference_shows_defaults_and_help():
    """A flag's row gives its default and its help text (--max-tokens: 2048 and the parser's words)."""
    from gen_pipeline.config import DEFAULT_MAX_TOKENS

    page = cli_reference().render()
    row = next(line for line in page.splitlines() if line.startswith("| `--max-tokens"))
    assert f"`{DEFAULT_MAX_TOKENS}`" in row and "output budget per prompt" in row


def test_a_hidden_flag_without_words_stops_the_build():
    """A flag hidden from --help that the reference has no words for is an error, not a silent gap."""
    hook = cli_reference()
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret-knob", help=argparse.SUPPRESS)
    with pytest.raises(KeyError, match="--secret-knob"):
        hook.render_command("x", parser, set())


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_points_outside_the_repository(path: Path):
    """Relative links stay inside the repository, and nothing names the team's ../shared folder: a user's
    clone has neither (the README once sent users to ../shared/reference/server-api.md)."""
    text = path.read_text()
    assert "../shared" not in text
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(REPO), f"{target} leaves the repository"
        generated = resolved == DOCS / cli_reference().PAGE  # written by the hook at build time
        assert resolved.exists() or generated, f"{target} does not exist"
