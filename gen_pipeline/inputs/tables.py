"""Tables as rows: Parquet and Arrow files (a row's position is its number), and CSV (its byte offset).

Parquet is read a batch at a time (pyarrow's iter_batches), from the row group that holds a resume's first
row: the row groups before it are skipped by the row counts of the file's metadata, unread. An Arrow file
is memory-mapped: its rows are read where they lie, and a resume starts at its row at once. Either way
memory holds one batch of rows (one row group while Parquet decodes it).

A CSV file's first line names its columns; each later record is a row of text cells (`max_tokens` and
`samples` cells written as integers are integers; `messages`, `sampling`, `tools` and the like written as
JSON are their JSON; an empty `id` cell is no id). A record may span lines (a quoted cell with newlines).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..errors import InputError
from .file import UTF8_BOM, InputFile, hash_prefix
from .readers import TURN_COLUMNS, Record, RowReader, one_line, row_line

BATCH = 1024  # rows converted at a time
FOOTER_TAIL = 8  # a Parquet file ends with its metadata's length (4 bytes, little-endian) and b"PAR1"
MAX_CELL = 64 << 20  # csv's own limit (128 KiB) would refuse a long prompt
INTEGER_CELLS = ("max_tokens", "samples")
JSON_CELLS = (*TURN_COLUMNS, "sampling", "tools", "chat_template_kwargs")


class TableRows(RowReader):
    """Rows of a pyarrow Table (memory-mapped: nothing is read before it is asked for)."""

    def table(self) -> Any:
        """The whole table (pyarrow.Table)."""
        raise NotImplementedError

    def records(self, start: int) -> Iterator[Record]:
        position = start
        for batch in self.table().slice(start).to_batches(max_chunksize=BATCH):
            for row in batch.to_pylist():
                position += 1
                yield Record(row_line(row), position)

    def line_at(self, position: int) -> bytes:
        rows = self.table().slice(position, 1).to_pylist()
        if not rows:
            raise InputError(f"{self.path} has no row {position + 1}")
        return row_line(rows[0])

    def rows(self) -> int | None:
        return int(self.table().num_rows)

    def check(self) -> None:
        self.table()


class ArrowReader(TableRows):
    """An Arrow IPC file (the file format, or the stream format `datasets` writes), memory-mapped."""

    kind = "arrow"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._table: Any = None

    def table(self) -> Any:
        if self._table is None:
            import pyarrow as pa

            try:
                source = pa.memory_map(str(self.path))
                try:
                    self._table = pa.ipc.open_file(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    self._table = pa.ipc.open_stream(source).read_all()
            except (OSError, pa.ArrowException) as exc:
                raise InputError(f"cannot read {self.path} as an Arrow file: {one_line(exc)}") from exc
        return self._table


class ParquetReader(RowReader):
    """A Parquet file, a batch at a time from the row group a start falls in (module docstring)."""

    kind = "parquet"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._file: Any = None
        self._group: tuple[int, list[dict[str, Any]]] | None = None  # the row group line_at read last

    def parquet(self) -> Any:
        """The pyarrow.parquet.ParquetFile (its metadata read, no row)."""
        if self._file is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                self._file = pq.ParquetFile(str(self.path))
            except (OSError, pa.ArrowException) as exc:
                raise InputError(f"cannot read {self.path} as Parquet: {one_line(exc)}") from exc
        return self._file

    def check(self) -> None:
        self.parquet()

    def rows(self) -> int | None:
        return int(self.parquet().metadata.num_rows)

    def _group_of(self, position: int) -> tuple[int, int]:
        """The row group that holds row `position` and the number of its first row, by the metadata's counts."""
        meta, first = self.parquet().metadata, 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if position < first + n:
                return g, first
            first += n
        return meta.num_row_groups, first

    def records(self, start: int) -> Iterator[Record]:
        group, position = self._group_of(start)
        groups = list(range(group, self.parquet().metadata.num_row_groups))
        if not groups:
            return
        for batch in self.parquet().iter_batches(batch_size=BATCH, row_groups=groups):
            skip = max(0, start - position)
            if skip >= batch.num_rows:
                position += batch.num_rows
                continue
            rows = batch.slice(skip).to_pylist()
            position += skip
            for row in rows:
                position += 1
                yield Record(row_line(row), position)

    def line_at(self, position: int) -> bytes:
        group, first = self._group_of(position)
        if self._group is None or self._group[0] != group:
            self._group = (group, self.parquet().read_row_group(group).to_pylist())
        rows = self._group[1]
        if not 0 <= position - first < len(rows):
            raise InputError(f"{self.path} has no row {position + 1}")
        return row_line(rows[position - first])

    def fingerprint(self) -> dict[str, Any]:
        st = self.path.stat()
        with self.path.open("rb") as f:
            f.seek(max(0, st.st_size - FOOTER_TAIL))
            tail = f.read(FOOTER_TAIL)
            length = int.from_bytes(tail[:4], "little")
            f.seek(max(0, st.st_size - FOOTER_TAIL - length))
            footer = hashlib.sha256(f.read(length)).hexdigest()[:16]
        return {"name": self.path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "footer": footer}

    def close(self) -> None:
        self._group = None
        if self._file is not None:
            self._file.close()
            self._file = None


class _Lines:
    """A binary stream's lines, decoded for csv.reader, with the byte position after each and the bytes taken."""

    def __init__(self, stream: BinaryIO, position: int) -> None:
        self.stream, self.position, self.taken = stream, position, bytearray()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        raw = self.stream.readline(MAX_CELL)
        if not raw:
            raise StopIteration
        self.taken += raw
        self.position += len(raw)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"invalid UTF-8 at byte {self.position - len(raw) + exc.start}") from None

    def take(self) -> bytes:
        """The bytes read since the last take."""
        taken, self.taken = bytes(self.taken), bytearray()
        return taken


class CsvReader(RowReader):
    """A CSV file with a header line (module docstring); positions are byte offsets, as for JSONL."""

    kind, by_rows = "csv", False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.file = InputFile(path)
        self._stream: BinaryIO | None = None
        self._header: tuple[list[str], int, bytes] | None = None
        csv.field_size_limit(max(csv.field_size_limit(), MAX_CELL))

    def header(self) -> tuple[list[str], int, bytes]:
        """The column names, where the first record starts, and the header's bytes."""
        if self._header is None:
            with self.file.open_at(0) as f:
                lines = _Lines(f, 0)
                names = next(csv.reader(lines), None)
                if not names:
                    raise InputError(f"{self.path} has no header line naming its columns")
                taken = lines.take()
            names[0] = names[0].removeprefix(UTF8_BOM.decode())
            self._header = (names, lines.position, taken)
        return self._header

    def check(self) -> None:
        self.header()

    def records(self, start: int) -> Iterator[Record]:
        names, first, head = self.header()
        start = max(start, first)
        with self.file.open_at(start) as f:
            self._stream = f
            lines = _Lines(f, start)
            carry = head if start == first else b""  # bytes before the first row: hashed with it
            for cells in csv.reader(lines):
                consumed, carry = carry + lines.take(), b""
                if cells:
                    yield Record(row_line(_row(names, cells)), lines.position, consumed)
                else:  # a blank line: no row, its bytes go with the next one
                    carry = consumed

    def fraction(self, position: int) -> float:
        if self._stream is not None and self.file.kind is not None:
            return self.file.fraction(self._stream, position)
        return min(1.0, position / self.file.size)

    def prefix_hash(self, position: int) -> Any:
        return hash_prefix(self.path, position)


def _row(names: list[str], cells: list[str]) -> dict[str, Any]:
    """One CSV record as a row: cells by column name, typed where a column's meaning says (module docstring)."""
    row: dict[str, Any] = {}
    for name, cell in zip(names, cells, strict=False):
        row[name] = _cell(name, cell)
    if len(cells) > len(names):
        row["_extra_cells"] = cells[len(names) :]
    return row


def _cell(name: str, cell: str) -> Any:
    if name == "id" and cell == "":
        return None
    if name in INTEGER_CELLS and cell.isdigit():
        return int(cell)
    if name in JSON_CELLS and cell[:1] in ("[", "{"):
        try:
            return orjson.loads(cell)
        except orjson.JSONDecodeError:
            return cell
    return cell
