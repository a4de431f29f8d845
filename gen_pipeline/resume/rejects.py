"""Reading rejected.jsonl back: what `report` and export's dataset card count of the rejected answers (the
resume scan counts each key's attempts itself: rundir.store.spent)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..rundir.layout import RunDir
from ..rundir.store import iter_json_lines


@dataclass
class RejectCounts:
    """The rejected answers of some runs: how many, by reason and by check, and the decode tokens they cost."""

    answers: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_check: Counter[str] = field(default_factory=Counter)
    tokens: int = 0

    def by_check_text(self) -> str:
        return ", ".join(f"{check} {n}" for check, n in self.by_check.most_common())


def reject_counts(runs: Sequence[Path]) -> RejectCounts:
    """Every whole line of the runs' rejected.jsonl files, counted."""
    counts = RejectCounts()
    for path in (p for run in runs for p in RunDir(run).rejected_files()):
        for _, obj in iter_json_lines(path):
            if obj is None or "reason" not in obj:
                continue
            counts.answers += 1
            counts.by_reason[str(obj["reason"])] += 1
            counts.by_check[str(obj.get("check"))] += 1
            tokens = obj.get("completion_tokens")
            counts.tokens += tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
    return counts
