"""How far a run is, in one unit: rows (--turns last), samples (--samples k), or turns (--turns all).

A unit is one key of the output: a line of completions.jsonl or of failures.jsonl. Settled units are those
written by this run (done or ledgered), those earlier runs settled (skipped), and, under --turns all, the
turns a conversation will not send because it ended early. The total comes from a count of the input made
beside the run (engine/workload.py); until it arrives, or where it cannot be made, it is unknown.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


def unit_name(turns: str, samples: int) -> str:
    """The unit a run's progress counts in."""
    return "turn" if turns == "all" else "row" if samples == 1 else "sample"


@dataclass
class Work:
    """The progress unit's figures that are not RunStats' own counters (completed, failed)."""

    unit: str = "row"
    per_row: int = 1  # units in a row whose own count is not known (the run's --samples)
    total: int | None = None  # units the input holds (within --limit); None while unknown
    skipped: int = 0  # units earlier runs settled, met on this run's pass over the input
    carried_rows: int = 0  # rows before the input cursor (all settled): handed over as tallies, not read
    carried: int | None = None  # their units, once the count has reached the cursor
    dropped: int = 0  # --turns all: turns not sent because their conversation ended (a failure, over_length)
    read_all: bool = False  # the reader has reached the end of the input (or of --limit)
    stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def counts_for(self, turns: str, samples: int) -> None:
        """Count in the unit of a run with these --turns and --samples."""
        self.unit, self.per_row = unit_name(turns, samples), samples

    def skipped_units(self) -> int:
        """Units earlier runs settled: those met on this pass and those before the input cursor."""
        before = self.carried if self.carried is not None else self.carried_rows * self.per_row
        return self.skipped + before

    def counted(self, before: int, total: int) -> None:
        """The input's count arrived: `before` units lie before the input cursor, `total` in all."""
        self.carried, self.total = before, total
