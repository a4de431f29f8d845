"""Answered rows whose prompt changed in the input since (resume/changes.py finds them): counted, the first named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NAMED = 5  # ids named in the summary and by check


@dataclass
class ChangedInputs:
    """How many answered rows have another prompt now, how many were answered again, and the first ids."""

    rows: int = 0
    redone: int = 0
    first: list[Any] = field(default_factory=list)

    def note(self, row_id: Any, redone: bool) -> None:
        """One answered row whose prompt changed (`redone`: answered again, --redo-changed)."""
        self.rows += 1
        self.redone += redone
        if len(self.first) < NAMED:
            self.first.append(row_id)

    def view(self) -> dict[str, Any]:
        """summary.json's `changed_inputs` (empty when none changed)."""
        return {"rows": self.rows, "redone": self.redone, "first": self.first} if self.rows else {}

    def warning(self) -> str | None:
        """What the summary says of them."""
        return changed_warning(self.view())


def changed_warning(view: dict[str, Any]) -> str | None:
    """The summary's (and check's) line on changed inputs, from their view."""
    if not view.get("rows"):
        return None
    named = ", ".join(repr(i) for i in view["first"]) + (", ..." if view["rows"] > len(view["first"]) else "")
    rows, redone = view["rows"], view.get("redone", 0)
    if redone:
        return (
            f"{rows} answered row(s) have another prompt in the input than they were answered with ({named}): "
            f"{redone} answered again (--redo-changed); export keeps the newer answer"
        )
    return (
        f"{rows} answered row(s) have another prompt in the input than they were answered with ({named}): their "
        "answers are of the old prompt; --redo-changed answers them again (the output stays append-only, "
        "export keeps the newer answer)"
    )


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts' views added up (the first ids of each, up to NAMED)."""
    total = ChangedInputs()
    for part in parts:
        total.rows += part.get("rows", 0)
        total.redone += part.get("redone", 0)
        total.first += part.get("first", [])[: NAMED - len(total.first)]
    return total.view()
