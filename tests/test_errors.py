"""errors.py's drawing is the whole tree: every class that derives from PipelineError, wherever it is
defined, is drawn there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gen_pipeline"


def pipeline_errors(package: Path = PACKAGE) -> set[str]:
    """The names of the classes deriving from PipelineError, read statically from every module."""
    bases: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                bases.setdefault(node.name, set()).update(names)
    found, grew = {"PipelineError"}, True
    while grew:
        more = {name for name, of in bases.items() if of & found} - found
        found |= more
        grew = bool(more)
    return found


def drawn(package: Path = PACKAGE) -> set[str]:
    """The class names errors.py's docstring draws in its tree."""
    doc = ast.get_docstring(ast.parse((package / "errors.py").read_text(encoding="utf-8"))) or ""
    return set(re.findall(r"(?:──|^ {4})\s*(\w+)", doc, re.M))


def test_every_pipeline_error_is_drawn_in_the_tree() -> None:
    """A new error joins the drawing, whichever module defines it."""
    assert pipeline_errors() - drawn() == set()


def test_an_undrawn_error_is_found(tmp_path: Path) -> None:
    """A class two steps below PipelineError in another module, left out of the drawing, is reported."""
    (tmp_path / "errors.py").write_text('"""Tree.\n\n    PipelineError\n    └── ConfigError\n\nThe end.\n"""\n')
    (tmp_path / "a.py").write_text(
        "class ConfigError(PipelineError): ...\nclass Mid(ConfigError): ...\nclass Low(Mid): ...\n"
    )
    assert pipeline_errors(tmp_path) - drawn(tmp_path) == {"Mid", "Low"}
