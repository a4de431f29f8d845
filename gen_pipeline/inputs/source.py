"""Streaming the prompts JSONL: each row validated (rows.py), exact repeats dropped, settled rows skipped.

Every line yields a `Prompt` or a `BadRow` (or a Skipped tally on resume); nothing is silently lost. Why a
row is skipped is decided here, by asking one collaborator (`Owners`) about its id: a later row of an id is a
repeat (dropped) or a conflict (a BadRow), and a first row whose id an earlier run settled is Skipped with
that reason. A claimer's `mine` filter leaves other claimers' rows out. The rest of "is this row settled?"
(its samples, a bad row already ledgered) is resume/settled.py's. Memory holds the byte offset of the first
row of each distinct id (for repeat and conflict detection), never the rows themselves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

from ..digests import row_digest
from ..errors import InputError
from ..records import Prompt, RowId, id_key, parsed_id, peek_key
from ..rundir.donekeys import KeyMap
from .file import STREAM_ERRORS, InputFile, strip_bom
from .kinds import open_reader
from .readers import RowReader
from .rows import BadRow, RowError, conflict_detail, own_samples, parse_row, same_content
from .shape import RowShape

# A line longer than this is a bad_input row, read in blocks and never held whole (a 20 MB row is fine).
MAX_LINE_BYTES = 64 << 20
# A pass from the top whose first this many rows are all bad stops: the file is not prompts JSONL.
ALL_BAD_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Skipped:
    """Rows earlier runs already settled ("done", or its permanent ledger reason): one, or `count`."""

    reason: str
    count: int = 1


_SKIPPED: dict[str, Skipped] = {}


def skipped(reason: str) -> Skipped:
    """The one Skipped item per reason (resuming 650k settled rows allocates nothing per row)."""
    item = _SKIPPED.get(reason)
    if item is None:
        item = _SKIPPED[reason] = Skipped(reason)
    return item


class Owners(Protocol):
    """Who owns each id a pass meets, and whether it is settled: resume.settled.SettledRows (the rows an input
    cursor's prefix holds, what earlier runs settled, then this pass), FirstSeen (this pass alone), DictSettled."""

    def owner(self, key: int, offset: int) -> tuple[int | None, str | None]:
        """(offset of the row that owns this id, or None when the row at `offset` is its first), and why that
        first row needs no request ("done", a permanent ledger reason) or None. A first row becomes the owner."""


class FirstSeen:
    """`Owners` of a pass with nothing settled before it: the first row of an id owns it."""

    def __init__(self) -> None:
        self.seen = KeyMap()  # id key -> offset of the row that owns it, ~20 bytes a row

    def owner(self, key: int, offset: int) -> tuple[int | None, str | None]:
        return self.seen.first(key, offset), None


class DictSettled(FirstSeen):
    """`Owners` from a plain function of the key saying why it is settled (tests, small inputs)."""

    def __init__(self, settled: Callable[[int], str | None]) -> None:
        super().__init__()
        self.settled = settled
        self.offsets: dict[int, int] = {}  # settled id -> offset of the row that owns it

    def owner(self, key: int, offset: int) -> tuple[int | None, str | None]:
        before = self.offsets.get(key)
        if before is not None:
            return before, None
        reason = self.settled(key)
        if reason is None:
            return super().owner(key, offset)
        self.offsets[key] = offset
        return None, reason


class PassLog(Protocol):
    """Hears, in file order, the rows that own their id and the bad rows a pass meets: resume.cursor.CursorLog
    keeps them for the input cursor."""

    def owner(self, key: int, offset: int) -> None:
        """The row at `offset` is the first with id key `key`."""

    def bad(self, line: int, key: int = 0) -> None:
        """The row at `line` is bad (`key`: its id key when it owns that id, else 0)."""

    def stop(self) -> None:
        """Nothing heard from now on could be recorded (the input's last line was read before its newline)."""


@dataclass
class Start:
    """Where a pass begins: the top of the file, or an input cursor's mark (resume/cursor.py)."""

    offset: int = 0
    line: int = 0
    repeats: int = 0
    hasher: Any = None  # hashlib.sha256 of the bytes before `offset`


class PromptSource:
    """Iterates a prompts file as Prompt, BadRow and Skipped items; repeats of an id are handled here.

    The first row with an id owns it (valid or not); a later row with that id is a repeat (dropped) when
    `same_content`, else a conflict (a BadRow). Who owns an id, and whether earlier runs settled it, the source
    asks `owners` (rows whose settled id leads the line are skipped without being parsed), so the answer never
    depends on what earlier runs did.

    For the input cursor, a pass keeps a SHA-256 of the bytes read and tells `log` (a PassLog) the owners and
    bad rows it meets; it can `start` at a cursor's mark.
    """

    def __init__(
        self,
        path: Path,
        owners: Owners | Callable[[int], str | None] | None = None,
        mine: Callable[[int], bool] | None = None,
        start: Start | None = None,
        shape: RowShape | None = None,
        log: PassLog | None = None,
        parse_done: bool = False,
        same_row: Callable[[int, int | None], bool] | None = None,
        row_key: bytes | None = None,
    ) -> None:
        self.path = path
        self.shape = shape  # the run's --template and --turns (None: rows as written)
        self.owners: Owners = DictSettled(owners) if callable(owners) else owners or FirstSeen()
        self._ask = self.owners.owner  # asked of each row with an id
        self.mine = mine  # a worker's filter: called with the id key, or the line number of a row without id
        self.log = log
        start = start or Start()
        self.start = start.offset
        self.reader = open_reader(path)  # None: JSONL, read line by line here
        self.input = InputFile(path) if self.reader is None else None
        self.hasher = start.hasher
        if self.hasher is None:  # a table's hash vouches for the file, not for bytes read: the same at every row
            by_rows = self.reader is not None and self.reader.by_rows
            self.hasher = self.reader.prefix_hash(0) if by_rows and self.reader else hashlib.sha256()
        self.repeats = start.repeats
        self.bytes_read = start.offset
        self.lines = start.line
        self.parse_done = parse_done  # a row whose id is done is parsed and handed on (its prompt is compared)
        # ... unless same_row(key, its row digest) says it was answered from these very bytes (digests.py)
        self.same_row, self.row_key = same_row, row_key
        self.unfinished: int | None = None  # the last line, held back: no newline yet and not whole JSON
        self.read_error: str | None = None  # why reading stopped before the end (a truncated compressed stream)
        self._stream: BinaryIO | None = None
        self._bad_run = 0 if self.start == 0 else -1  # bad rows since the top, while no good one came; -1: off

    def __iter__(self) -> Iterator[Prompt | BadRow | Skipped]:
        try:
            if self.reader is not None:
                yield from self._records(self.reader)
                return
            assert self.input is not None
            with self.input.open_at(self.start) as f:
                self._stream = f
                try:
                    yield from self._rows(f)
                except STREAM_ERRORS as exc:  # a truncated or corrupt compressed stream
                    # the rows before the cut are all yielded: the run settles them, then says why it stopped
                    self.read_error = f"cannot read {self.path} after line {self.lines}: {exc}"
        finally:  # also when the pass is closed early (--limit, a stop): the repeat reader is ours to close
            self.close()

    def close(self) -> None:
        """Close what the pass holds open (the repeat reader, a table's file)."""
        if self.input is not None:
            self.input.close()
        if self.reader is not None:
            self.reader.close()

    def _records(self, reader: RowReader) -> Iterator[Prompt | BadRow | Skipped]:
        """The rows of an input that is not JSONL (readers.py), each handed on as its JSON line."""
        try:
            for record in reader.records(self.start):
                offset, self.bytes_read = self.bytes_read, record.end
                self.lines += 1
                if record.consumed is not None:
                    self.hasher.update(record.consumed)
                item = self._item(record.raw, self.lines, offset)
                if item is not None:
                    self._watch(item)
                    yield item
        except (InputError, *STREAM_ERRORS) as exc:  # a cut stream, a broken array: what came before is settled
            self.read_error = f"cannot read {self.path} after row {self.lines}: {exc}"

    def _rows(self, f: BinaryIO) -> Iterator[Prompt | BadRow | Skipped]:
        readline = f.readline
        while raw := readline(MAX_LINE_BYTES + 1):
            if not raw.endswith(b"\n") and len(raw) <= MAX_LINE_BYTES:
                last = self._last_line(raw)  # only the last line can lack its newline
                if last is not None:
                    yield last
                return
            offset = self.bytes_read
            self.bytes_read += len(raw)
            self.lines += 1
            self.hasher.update(raw)
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                size, line = self._rest_of_line(f, len(raw)), self.lines
                if self.mine is None or self.mine(line):  # no id can be read: its line number places it
                    yield self._too_long(line, size)
                continue
            raw = strip_bom(raw, offset).rstrip(b"\r\n")
            if not raw or raw.isspace():
                continue  # blank lines are not rows
            item = self._item(raw, self.lines, offset)
            if item is not None:
                self._watch(item)
                yield item

    def _last_line(self, raw: bytes) -> Prompt | BadRow | Skipped | None:
        """The input's last line, without its newline: a producer may still be writing it. Unless it is whole
        JSON already, it is left for a later run (`unfinished`), never ledgered. Either way the pass does not
        count it as read, so the input cursor stays before it and the next run reads it again, grown or ended."""
        line, offset = self.lines + 1, self.bytes_read
        text = strip_bom(raw, offset).rstrip(b"\r")
        if not text or text.isspace():
            return None
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError:
            self.unfinished = line
            return None
        if self.log is not None:
            self.log.stop()  # nothing the cursor could record lies beyond it
        item = self._item(text, line, offset)
        if item is not None:
            self._watch(item)
        return item

    def fraction(self) -> float:
        """How much of the input this pass has read (compressed bytes for a compressed file)."""
        if self.reader is not None:
            return self.reader.fraction(self.bytes_read)
        return self.input.fraction(self._stream, self.bytes_read) if self.input and self._stream else 0.0

    def _rest_of_line(self, f: BinaryIO, size: int) -> int:
        """Read and drop the rest of a line over MAX_LINE_BYTES, in blocks; the whole line's size."""
        while not (block := f.readline(MAX_LINE_BYTES)).endswith(b"\n") and block:
            self.bytes_read += len(block)
            self.hasher.update(block)
            size += len(block)
        self.bytes_read += len(block)
        self.hasher.update(block)
        return size + len(block)

    def _too_long(self, line: int, size: int) -> BadRow:
        """A line over MAX_LINE_BYTES: a bad row."""
        self._bad(line)
        self._watch(None)
        return BadRow(line, f"line is {size} bytes, over the {MAX_LINE_BYTES >> 20} MiB line limit")

    def _watch(self, item: Prompt | BadRow | Skipped | None) -> None:
        """Stop a pass from the top whose first ALL_BAD_LIMIT rows are all bad (None: a bad row)."""
        if self._bad_run < 0:
            return
        if item is not None and not isinstance(item, BadRow):
            self._bad_run = -1  # a good row: the file is prompts, however many bad ones follow
            return
        self._bad_run += 1
        if self._bad_run >= ALL_BAD_LIMIT:
            example = f"line {item.line}: {item.detail}" if item is not None else "lines over the size limit"
            raise InputError(
                f"the first {ALL_BAD_LIMIT} rows of {self.path} are all invalid ({example}): "
                "does it hold prompts? Nothing was sent or written"
            )

    def _item(self, raw: bytes, line: int, offset: int) -> Prompt | BadRow | Skipped | None:
        prompt = error = None
        peeked = peek_key(raw)
        if peeked is None:
            try:
                prompt = parse_row(raw, line, self.shape)
                rid, key = prompt.id, prompt.key
            except RowError as exc:
                error, bad_id = str(exc), parsed_id(raw)  # the id of an invalid row, when it can still be read
                rid, key = (bad_id, id_key(bad_id)) if bad_id is not None else (None, None)  # type: ignore[assignment]
        else:
            rid, key = peeked
        if self.mine is not None and not self.mine(line if key is None else key):
            return None  # another worker's row
        answered = False  # an answered row read to compare its prompt (parse_done)
        if key is not None:
            owner, reason = self._ask(key, offset)
            if owner is None and self.log is not None:
                self.log.owner(key, offset)  # the first row of its id
            if owner is not None:
                return self._again(raw, owner, rid, line)
            answered = self.parse_done and reason == "done"
            if (
                answered
                and self.same_row is not None
                and not own_samples(raw)
                and self.same_row(key, self._digest(raw))
            ):
                return skipped("done")  # answered from these very bytes: its prompt is the one it was sent
            if reason is not None and not own_samples(raw) and not answered:
                return skipped(reason)  # settled by an earlier run: not even parsed when the id leads
        if prompt is None and error is None:
            try:
                prompt = parse_row(raw, line, self.shape)  # refuses a row with two "id" keys (the peek read the first)
            except RowError as exc:
                error = str(exc)
        if error is None:
            prompt.row_digest = self._digest(raw)  # type: ignore[union-attr]
            return prompt
        if answered:
            return skipped("done")  # answered, and no longer a valid row: left as it is, as it always was
        self._bad(line, key or 0)
        return BadRow(line, error, rid)

    def _digest(self, raw: bytes) -> int | None:
        """The row's digest under the run's shaping (digests.py; None: the reader gave none)."""
        return row_digest(self.row_key, raw) if self.row_key is not None else None

    def _bad(self, line: int, key: int = 0) -> None:
        if self.log is not None:
            self.log.bad(line, key)

    def _line_at(self, offset: int) -> bytes:
        """The row at `offset` again (only for the rare row whose id came before)."""
        if self.reader is not None:
            return self.reader.line_at(offset)
        assert self.input is not None
        return self.input.line_at(offset)

    def _again(self, raw: bytes, owner: int, rid: RowId | None, line: int) -> BadRow | None:
        """A row whose id came before: a repeat (processed once) or a conflict (bad_input)."""
        if same_content(raw, self._line_at(owner)):
            self.repeats += 1
            return None
        self._bad(line)
        # ledgered without the id: this row is not that id's, so its entry must never stand for the id
        # ("the newest entry per id decides") and make a done or pending row read as failed
        return BadRow(line, conflict_detail(raw, rid), shard_id=rid)
