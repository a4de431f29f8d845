"""Streaming the prompts JSONL: each row validated (rows.py), exact repeats dropped, settled rows skipped.

Every line yields a `Prompt` or a `BadRow` (or a Skipped tally on resume); nothing is silently lost. Memory
holds the byte offset of the first row of each distinct id (for repeat and conflict detection), never the
rows themselves.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

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


class Settled(Protocol):
    """What the resume state says about ids during one pass (rundir.store.SettledRows, or DictSettled)."""

    def visit(self, key: int, offset: int) -> tuple[str | None, int | None]: ...


class DictSettled:
    """`Settled` from a plain function of the key, remembering offsets in a dict (tests, small inputs)."""

    def __init__(self, settled: Callable[[int], str | None]) -> None:
        self.settled = settled
        self.offsets: dict[int, int] = {}

    def visit(self, key: int, offset: int) -> tuple[str | None, int | None]:
        before = self.offsets.get(key)
        if before is not None:
            return "settled", before
        reason = self.settled(key)
        if reason is not None:
            self.offsets[key] = offset
        return reason, None


class Prior(Protocol):
    """The ids an input cursor's prefix holds: key -> offset of the row that owns it."""

    def get(self, key: int) -> int | None: ...


@dataclass
class Start:
    """Where a pass begins: the top of the file, or an input cursor's mark (see `cursor`)."""

    offset: int = 0
    line: int = 0
    repeats: int = 0
    hasher: Any = None  # hashlib.sha256 of the bytes before `offset`
    prior: Prior | None = None


class PromptSource:
    """Iterates a prompts file as Prompt, BadRow and Skipped items; repeats of an id are handled here.

    The first row with an id owns it (valid or not); a later row with that id is a repeat (dropped) when
    `same_content`, else a conflict (a BadRow). Each owner is remembered by its byte offset, in
    `settled` (the resume state: rows earlier runs settled, skipped without being parsed when their id
    leads the line) or in `seen`, so the answer never depends on what earlier runs did.

    For the input cursor, a pass keeps a SHA-256 of the bytes read and a log of the owners it met,
    (key, offset) pairs in file order; it can `start` after a cursor's prefix, whose owners are `prior`.
    """

    def __init__(
        self,
        path: Path,
        settled: Settled | Callable[[int], str | None] | None = None,
        mine: Callable[[int], bool] | None = None,
        start: Start | None = None,
        shape: RowShape | None = None,
    ) -> None:
        self.path = path
        self.shape = shape  # the run's --template and --turns (None: rows as written)
        self.settled: Settled | None = DictSettled(settled) if callable(settled) else settled
        self.mine = mine  # a worker's filter: called with the id key, or the line number of a row without id
        start = start or Start()
        self.start = start.offset
        self.prior = start.prior
        self.reader = open_reader(path)  # None: JSONL, read line by line here
        self.input = InputFile(path) if self.reader is None else None
        self.hasher = start.hasher
        if self.hasher is None:  # a table's hash vouches for the file, not for bytes read: the same at every row
            by_rows = self.reader is not None and self.reader.by_rows
            self.hasher = self.reader.prefix_hash(0) if by_rows and self.reader else hashlib.sha256()
        self.seen = KeyMap()  # id key -> offset of the row that owns it, ~20 bytes a row
        self.repeats = start.repeats
        self.bytes_read = start.offset
        self.lines = start.line
        self.log = array("Q")  # (key, offset) of each owner met, in file order; the cursor drains it
        self.bad_log = array("Q")  # (line, key when the row owns its id else 0) of each bad row
        self.owned = self.bad_count = 0  # pairs logged by this pass
        self.logging = True  # off once the cursor cannot move further in this run
        self.parse_done = False  # a row whose id is done is parsed and handed on (its prompt is compared)
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
        self.logging = False  # nothing the cursor could record lies beyond it
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
        self.note_bad(line)
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
            owner, reason = self._owner(key, offset)
            if owner is not None:
                return self._again(raw, owner, rid, line)
            answered = self.parse_done and reason == "done"
            if reason is not None and not own_samples(raw) and not answered:
                return skipped(reason)  # settled by an earlier run: not even parsed when the id leads
        if prompt is None and error is None:
            try:
                prompt = parse_row(raw, line, self.shape)  # refuses a row with two "id" keys (the peek read the first)
            except RowError as exc:
                error = str(exc)
        if error is None:
            return prompt
        if answered:
            return skipped("done")  # answered, and no longer a valid row: left as it is, as it always was
        self.note_bad(line, key or 0)
        return BadRow(line, error, rid)

    def note_bad(self, line: int, key: int = 0) -> None:
        """Log a bad row for the cursor: its line, and its id key when it owns that id."""
        if self.logging:
            self.bad_log.append(line)
            self.bad_log.append(key)
            self.bad_count += 1

    def _owner(self, key: int, offset: int) -> tuple[int | None, str | None]:
        """(offset of the row that owns this id, or None when this row is its first), and why that first
        row is settled. A first row is remembered as the owner."""
        if self.prior is not None and (owner := self.prior.get(key)) is not None:
            return owner, None
        reason = None
        if self.settled is not None:
            reason, owner = self.settled.visit(key, offset)
            if owner is not None:
                return owner, None
        if reason is None and (owner := self.seen.first(key, offset)) is not None:
            return owner, None
        if self.logging:
            self.log.append(key)
            self.log.append(offset)
            self.owned += 1
        return None, reason

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
        self.note_bad(line)
        # ledgered without the id: this row is not that id's, so its entry must never stand for the id
        # ("the newest entry per id decides") and make a done or pending row read as failed
        return BadRow(line, conflict_detail(raw, rid), shard_id=rid)
