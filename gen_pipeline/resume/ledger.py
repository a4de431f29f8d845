"""Reading the ledger back: the reason that stands for each row the output does not hold.

The newest entry per (id, sample) (and turn, under --turns all; of its newest restart generation:
restarts.py) decides (by its `time`, so ledger
shards written side by side compare); an entry whose (id, sample) has a completion line counts
nowhere (the row failed, then succeeded; or an earlier version ledgered a row that reused a done id
under that id); a bad row without an id counts once. `status`, `report` and export's dataset card all
count this way, so their figures agree.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..records import id_key
from ..rundir.donekeys import KeySet, completion_keys, union
from ..rundir.layout import RunDir
from ..rundir.store import iter_json_lines
from ..samples import note_generation, place_key, record_place
from .restarts import Generations, generations

T = TypeVar("T")


def done_keys(runs: Sequence[Path]) -> KeySet:
    """The (id, sample, turn) keys of every completion line of these runs (read, never re-indexed)."""
    keys: array[int] = array("Q")
    for path in (p for run in runs for p in RunDir(run).completion_files()):
        keys = union(keys, completion_keys(path, save=False).keys)
    return KeySet(keys, presorted=True)


def ledger_reasons(runs: Sequence[Path], done: Container[int] | None = None) -> Counter[str]:
    """How many rows of these runs each ledger reason stands for, among the rows not `done` (default:
    the runs' completion lines)."""
    return Counter(standing(runs, done, lambda obj: str(obj["reason"])))


def standing(runs: Sequence[Path], done: Container[int] | None, pick: Callable[[dict[str, Any]], T]) -> list[T]:
    """`pick` of each ledger entry that stands for a row the output does not hold: the newest per key not
    `done` (default: the runs' completion lines) and not of a restart generation older than its (id,
    sample)'s newest in its run (restarts.py), after each entry without an id. Given `done`, the
    generations are the ledger's alone."""
    runs_read: list[tuple[Generations, list[tuple[int, float, dict[str, Any]]]]] = []  # per run: (key, time, entry)
    anonymous: list[T] = []
    for run in runs:
        gens, entries = Generations(), list[tuple[int, float, dict[str, Any]]]()
        runs_read.append((gens, entries))
        for path in RunDir(run).failure_files():
            for _, obj in iter_json_lines(path):
                place = record_place(obj) if obj is not None and "reason" in obj else None
                if obj is None or place is None:
                    continue
                if obj.get("id") is None:
                    anonymous.append(pick(obj))
                    continue
                row = id_key(obj["id"])
                entries.append((place_key(row, *place), float(obj.get("time") or 0.0), obj))
                note_generation(gens.newest, row, place)
    if not any(entries for _, entries in runs_read):  # nothing a completion could stand against: not read
        return anonymous
    newest: dict[int, tuple[float, T]] = {}
    for run, (gens, entries) in zip(runs, runs_read, strict=True):
        if done is None:
            gens.add(generations(run, ledger=False))
        for key, when, obj in entries:
            if not gens.superseded_line(obj) and (key not in newest or when >= newest[key][0]):
                newest[key] = (when, pick(obj))
    if done is None:
        keys: array[int] = array("Q")
        for gens, _ in runs_read:
            keys = union(keys, gens.keys)
        done = KeySet(keys, presorted=True)
    return anonymous + [value for key, (_, value) in newest.items() if key not in done]
