"""What a run directory's files say, read for the views (status, report, plots, export): the columns of
the completion lines and the JSON files (the ledger's reasons: resume/ledger.py). Nothing here prints or writes."""

from __future__ import annotations

import math
import sys
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..rundir.layout import RunDir
from ..rundir.layout import read_manifest as read_manifest  # re-exported: the views read it from here
from ..rundir.store import iter_json_lines


def distribution(values: Sequence[int] | Sequence[float]) -> dict[str, Any]:
    """Count, min, p50, p90, p99 and max (nearest rank); just the count when empty."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> Any:
        return ordered[max(0, math.ceil(q * n) - 1)]

    return {"n": n, "min": ordered[0], "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[-1]}


@dataclass
class Completions:
    """The columns of completions*.jsonl that the report needs, in line order."""

    input_tokens: array[int] = field(default_factory=lambda: array("q"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    latency: array[float] = field(default_factory=lambda: array("d"))
    time: array[float] = field(default_factory=lambda: array("d"))  # when each came back (epoch s); nan: no time
    budget: array[int] = field(default_factory=lambda: array("q"))  # max_tokens as sent
    servers: Counter[str] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    truncated_in: Counter[str] = field(default_factory=Counter)  # "reasoning" / "answer", of finish "length"
    finish_of: list[str] = field(default_factory=list)  # each line's finish_reason (interned: one per reason)

    def __len__(self) -> int:
        return len(self.latency)

    def add(self, obj: dict[str, Any]) -> None:
        self.input_tokens.append(int(obj.get("input_tokens") or 0))
        self.completion_tokens.append(int(obj.get("completion_tokens") or 0))
        self.latency.append(float(obj.get("latency_s") or 0.0))
        when = obj.get("time")  # lines written before completions carried their time have none
        self.time.append(float(when) if isinstance(when, int | float) and not isinstance(when, bool) else math.nan)
        self.budget.append(int(obj.get("max_tokens") or 0))
        self.servers[str(obj.get("server"))] += 1
        self.finish[str(obj.get("finish_reason"))] += 1
        if obj.get("truncated_in"):
            self.truncated_in[str(obj["truncated_in"])] += 1
        self.finish_of.append(sys.intern(str(obj.get("finish_reason"))))


def completion_files(run: Path) -> list[Path]:
    """completions.jsonl, any static workers' and the claimed shards' (shards/SSSSS/completions.jsonl)."""
    return RunDir(run).completion_files()


def read_completions(run: Path) -> Completions:
    """Every complete completion line (a torn or corrupt line is skipped)."""
    rows = Completions()
    for path in completion_files(run):
        for _, obj in iter_json_lines(path):
            if obj is not None and "id" in obj:
                rows.add(obj)
    return rows


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing or unreadable."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None
