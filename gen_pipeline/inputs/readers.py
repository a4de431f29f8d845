"""The readers of inputs that are not JSONL: what each hands on (a row's JSON line) and vouches for.

    kind       --input                                     position of a row        read by
    jsonl      prompts.jsonl (.gz, .zst)                   byte offset              file.py, source.py
    json       a JSON array file: [{...}, {...}]           byte offset              jsonarray.py
    csv        rows.csv (.gz, .zst), a header line first   byte offset              tables.py
    parquet    data.parquet                                row number               tables.py
    arrow      data.arrow (Arrow IPC, file or stream)      row number               tables.py
    dataset    a folder `datasets` saved (save_to_disk), a folder of data files, or a hub dataset
               name `name[:config][:split]`                row number               hubdata.py

Every reader hands rows on as JSON object lines (orjson), so each is validated by the one validator
(rows.py) and repeats and conflicts are told apart as for JSONL. A position is where a row starts: a byte
offset in the (decompressed) stream for text, a row number for tables. The input cursor records one and a
resume starts there without reading what lies before it: text readers seek (a compressed stream is read up
to it), table readers skip whole row groups or batches by their row counts. What vouches for the rows
before a mark (`prefix_hash`) is the SHA-256 of the bytes before it for text; for a table, which is never
appended to, a digest of what says the file is the same (its size, its modification time, its own metadata).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import InputError

# What a table's row becomes: a JSON object line. A value JSON cannot hold (bytes, a decimal) is written as
# its text; numpy values as numbers.
DUMP_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
# Columns whose turns a table writes with every field of the column's type, null where a turn has none
TURN_COLUMNS = ("messages", "conversations", "conversation", "prompt")


@dataclass(frozen=True)
class Record:
    """One row as read: its JSON object line, where the next row starts, and the file bytes it took (text
    readers, for the input cursor's hash; None for tables)."""

    raw: bytes
    end: int
    consumed: bytes | None = None


class RowReader:
    """A non-JSONL input: rows from a position on, the row at a position, and what vouches for a prefix."""

    kind = "table"
    by_rows = True  # positions are row numbers (False: byte offsets in the decompressed stream)

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self, start: int) -> Iterator[Record]:
        """The rows from position `start` on."""
        raise NotImplementedError

    def check(self) -> None:
        """InputError, saying why, when the input cannot be read at all (its first row is read)."""
        for _ in self.records(0):
            break

    def line_at(self, position: int) -> bytes:
        """The JSON line of the row at `position` (the repeat check reads an id's first row again)."""
        for record in self.records(position):
            return record.raw
        raise InputError(f"{self.path} has no row at {position}")

    def rows(self) -> int | None:
        """How many rows the input holds (None: unknown without reading it)."""
        return None

    def fraction(self, position: int) -> float:
        """How much of the input lies before `position` (for progress)."""
        total = self.rows()
        return min(1.0, position / total) if total else 0.0

    def fingerprint(self) -> dict[str, Any]:
        """What says the input is the same one (claimed shards' settled markers, the input cursor)."""
        st = self.path.stat()
        return {"name": self.path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def prefix_hash(self, position: int) -> Any:
        """A hashlib object that vouches for the rows before `position`: for a table, its fingerprint."""
        return hashlib.sha256(orjson.dumps(self.fingerprint(), option=orjson.OPT_SORT_KEYS))

    def close(self) -> None:
        """Let go of what the reader holds open."""


def row_line(row: dict[str, Any]) -> bytes:
    """A table's row as the JSON object line the validator reads: its id first (so a resume can read it without
    parsing the row), and the turns of a conversation column without the null fields of its column type."""
    if "id" in row:
        row = {"id": row["id"], **row}
    for column in TURN_COLUMNS:
        turns = row.get(column)
        if isinstance(turns, list) and turns and isinstance(turns[0], dict):
            row[column] = [_without_nulls(t) for t in turns]
    return orjson.dumps(row, default=str, option=DUMP_OPTIONS)


def _without_nulls(turn: Any) -> Any:
    """A turn from a table without the fields its type gives every turn and this one leaves null (its content
    stays, null or not: an assistant turn that only calls tools)."""
    if not isinstance(turn, dict):
        return turn
    return {k: v for k, v in turn.items() if v is not None or k == "content"}


def one_line(exc: BaseException) -> str:
    """An error's message as one line (pyarrow's and datasets' run over several)."""
    return " ".join(str(exc).split())
