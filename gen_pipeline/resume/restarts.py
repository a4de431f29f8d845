"""Which lines of a run directory stand: an (id, sample) answered again is read in its newest restart
generation only (samples.py says what the marker is), its older lines superseded.

The generations come from the done-key index (rundir.donekeys keeps them per output file) and from the
ledger; `status`, the ledger's reasons and `export` read lines through `Generations.superseded`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import id_key
from ..rundir.donekeys import completion_keys, line_id, union
from ..rundir.layout import RunDir
from ..rundir.store import iter_json_lines
from ..samples import Place, line_place, note_generation, record_place, sample_key


@dataclass
class Generations:
    """The newest restart generation of each (id, sample) of one run directory that has one (few)."""

    newest: dict[int, int] = field(default_factory=dict)  # sample_key -> generation
    keys: array[int] = field(default_factory=lambda: array("Q"))  # every completion key, sorted (when read)

    def add(self, other: Generations) -> None:
        """Take in what `other` found (another file set of the same run directory)."""
        for plain, restart in other.newest.items():
            note_generation(self.newest, plain, (0, 0, restart))  # a sample_key is its sample 0's own key
        self.keys = union(self.keys, other.keys)

    def superseded(self, row_key: int, place: Place) -> bool:
        """Whether a line of the row with id key `row_key` at `place` belongs to an older generation."""
        return bool(self.newest) and place[2] < self.newest.get(sample_key(row_key, place[0]), 0)

    def superseded_line(self, obj: dict[str, Any]) -> bool:
        """superseded for a parsed output or ledger line (one without a usable place or id never is)."""
        place, rid = record_place(obj), obj.get("id")
        return place is not None and isinstance(rid, str | int) and self.superseded(id_key(rid), place)


def generations(run: Path, completions: bool = True, ledger: bool = True) -> Generations:
    """The generations of one run directory: from its output files (their keys kept too, read through the
    done-key index, never re-indexed) and its ledger."""
    found = Generations()
    if completions:
        for path in RunDir(run).completion_files():
            keys = completion_keys(path, save=False)
            found.keys = union(found.keys, keys.keys)
            for plain, restart in keys.restarts.items():
                note_generation(found.newest, plain, (0, 0, restart))  # a sample_key is its sample 0's key
    if ledger:
        for path in RunDir(run).failure_files():
            for _, obj in iter_json_lines(path):
                if obj is not None and obj.get("restart") and obj.get("id") is not None:
                    place = record_place(obj)
                    if place is not None:
                        note_generation(found.newest, id_key(obj["id"]), place)
    return found


def standing_lines(paths: Iterable[Path], found: Generations) -> int:
    """Complete output lines of these files that stand (a line without a usable id or place is not ours to
    judge: it counts as it did)."""
    standing = 0
    for path in paths:
        with path.open("rb") as f:
            for raw in f:
                if raw.endswith(b"\n"):
                    rid, place = line_id(raw), line_place(raw)
                    standing += rid is None or place is None or not found.superseded(id_key(rid), place)
    return standing
