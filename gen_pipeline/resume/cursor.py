"""The input cursor: where a resume may start reading the prompts file.

Without it, resuming a 650,000-row run reads every input row again only to skip it (~5 s here). A run
records in `DIR/.index/<input>.<hash>.all.cursor` the mark below which every input row was settled
(completed, in the ledger, a repeat or a bad row), together with:
- the input's device and inode and the SHA-256 of the bytes before the mark;
- the owners met there: (id key, byte offset) of the first row of each id, so that a later row with one
  of those ids is still told a repeat or a conflict;
- the bad rows there: (line, id key when the row owns its id, else 0).

The next run checks all of it against the input and the output files as they are now: the same bytes
before the mark, every owner still settled (or a bad row), every bad row still in the ledger. Then it
starts reading at the mark. Any mismatch (the input edited, an output file deleted, `--retry-failed`
reopening settled rows) means the whole input is read, as without a cursor. The cursor is a cache:
deleting it is always safe.

The mark moves in the run with the batches read: a batch's end is passed once every prompt in it is
settled. A transient failure holds it for the rest of the run (the row must be read again next time).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import InputError
from ..inputs.file import STREAM_ERRORS, hash_prefix
from ..inputs.kinds import input_identity, open_reader
from ..inputs.source import PromptSource, Start
from ..rundir.donekeys import INDEX_DIR, INDEX_EVERY, KeyMap
from .settled import ResumeState

CURSOR_VERSION = 1
CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Mark:
    """A pass's position between two lines: what it had read, met and logged before it."""

    offset: int
    line: int
    repeats: int
    owners: int  # owner pairs this pass logged before the mark
    bad: int  # bad-row pairs this pass logged before the mark
    sha: Any  # hashlib.sha256 of the input's bytes before the mark


class CursorLog:
    """What a pass met, for the cursor (the source calls it: inputs.source.PassLog): the owners, (key, offset)
    of the first row of each id, and the bad rows, (line, key when the row owns its id, else 0), in file
    order, until `stop`: then the cursor cannot move further in this run. The keeper drains what it saves."""

    def __init__(self) -> None:
        self.owners = array("Q")
        self.bad_rows = array("Q")
        self.owned = self.bad_count = 0  # pairs logged by this pass (drained ones too)
        self.on = True

    def owner(self, key: int, offset: int) -> None:
        if self.on:
            self.owners.append(key)
            self.owners.append(offset)
            self.owned += 1

    def bad(self, line: int, key: int = 0) -> None:
        if self.on:
            self.bad_rows.append(line)
            self.bad_rows.append(key)
            self.bad_count += 1

    def stop(self) -> None:
        """Log nothing more: a row failed for a transient reason (the next run reads it again), or the input's
        last line was read before its newline."""
        self.on = False


def mark_of(source: PromptSource, log: CursorLog) -> Mark:
    """Where `source` stands now, with what `log` heard of it (call it from the thread that iterates it)."""
    return Mark(source.bytes_read, source.lines, source.repeats, log.owned, log.bad_count, source.hasher.copy())


@dataclass
class Resumed:
    """A cursor that passed every check: where to start, and what the rows before it add up to."""

    start: Start
    tallies: dict[str, int]  # rows before the mark by why they are settled ("done", ledger reasons)
    owners: int  # pairs in the cursor file
    bad: int
    prior: KeyMap  # the owners before the mark: key -> offset of the row that owns it (ResumeState.rows)


def cursor_path(out: Path, input_path: Path) -> Path:
    """One cursor per input file (by its absolute path). `all`: the whole input (an older version's static
    workers kept one per shard, `.<i>of<K>.cursor`, which nothing reads)."""
    where = hashlib.sha256(str(input_path.resolve()).encode()).hexdigest()[:12]
    return out / INDEX_DIR / f"{input_path.name}.{where}.all.cursor"


def _header(path: Path) -> tuple[dict[str, Any], int]:
    with path.open("rb") as f:
        line = f.readline(1 << 16)
    if not line.endswith(b"\n"):
        raise ValueError("no header")
    return orjson.loads(line), len(line)


def _blocks(f: IO[bytes], size: int) -> Iterator[bytes]:
    """The next `size` bytes of `f` in blocks of at most CHUNK; ValueError when the file ends first."""
    while size > 0:
        block = f.read(min(CHUNK, size))
        if not block:
            raise ValueError(f"{getattr(f, 'name', 'the input')} is shorter than recorded")
        yield block
        size -= len(block)


def _hash_prefix(path: Path, position: int) -> Any:
    """What vouches for the input's rows before `position`: the SHA-256 of its bytes there, or a table's own
    digest (inputs/readers.py)."""
    reader = open_reader(path)
    if reader is None:
        return hash_prefix(path, position)
    try:
        return reader.prefix_hash(position)
    finally:
        reader.close()


def load(out: Path, input_path: Path, retry: frozenset[str], state: ResumeState) -> Resumed | None:
    """The cursor for this input, when it still holds against the input and `state`; else None."""
    path = cursor_path(out, input_path)
    try:
        head, body_at = _header(path)
        same = (
            head.get("version") == CURSOR_VERSION
            and head.get("input") == str(input_path.resolve())
            and (head.get("dev"), head.get("inode")) == input_identity(input_path)
            and int(head["offset"]) > 0  # a position in the decompressed stream: _hash_prefix finds a short file
            and head.get("samples", 1) == state.samples  # more samples now: the rows before the mark owe some
        )
        if not same:
            return None
        n_owners, n_bad = int(head["owners"]), int(head["bad"])
        if path.stat().st_size != body_at + 16 * (n_owners + n_bad):
            return None
        hasher = _hash_prefix(input_path, int(head["offset"]))
        if hasher.hexdigest() != head.get("sha256"):
            return None
        pairs = array("Q")
        with path.open("rb") as f:
            f.seek(body_at)
            pairs.fromfile(f, 2 * (n_owners + n_bad))
    except (*STREAM_ERRORS, KeyError, TypeError, InputError):
        return None
    if state.later_samples_ledgered and retry & set(state.last_reason.values()):
        return None  # a retried sample > 0 may hide behind its row's done sample 0: read from the top
    checked = _check(pairs, n_owners, input_path.name, retry, state)
    del pairs
    if checked is None:
        return None
    tallies, owners = checked
    start = Start(int(head["offset"]), int(head["line"]), int(head["repeats"]), hasher)
    return Resumed(start, tallies, n_owners, n_bad, owners)


def _check(
    pairs: array[int], n_owners: int, source: str, retry: frozenset[str], state: ResumeState
) -> tuple[dict[str, int], KeyMap] | None:
    """(rows before the mark by reason, the owners sorted by key) when all of them are still settled.
    `pairs`: the owners' (key, offset), then the bad rows' (line, key)."""
    import numpy as np  # only here: sorting and matching 650k keys takes 0.3 s, 3 s in Python

    both = np.frombuffer(pairs, dtype=np.uint64).reshape(-1, 2)
    order = np.argsort(both[:n_owners, 0], kind="stable")
    keys, offsets = both[order, 0], both[order, 1]
    del order
    done = np.frombuffer(state.done.keys, dtype=np.uint64) if len(state.done) else np.zeros(1, np.uint64)
    at = np.minimum(np.searchsorted(done, keys), len(done) - 1)
    in_done = done[at] == keys
    del at
    tallies = {"done": int(in_done.sum())} if in_done.any() else {}
    bad = both[n_owners:]
    bad_owners = set(bad[:, 1].tolist()) - {0}
    for key in keys[~in_done].tolist():  # ledger-settled owners (few), or bad rows that own their id
        reason = state.settled(key, retry)
        if reason is not None:
            tallies[reason] = tallies.get(reason, 0) + 1
        elif key not in bad_owners:
            return None  # a row that needs a request: read from the top
    for line, key in bad.tolist():
        if key and state.settled(key, retry) is not None:
            continue  # a bad row owning an id settled since: skipped by that id, counted above
        if "bad_input" in retry or (source, line) not in state.bad_lines:
            return None
        tallies["bad_input"] = tallies.get("bad_input", 0) + 1
    sorted_keys, sorted_offsets = array("Q"), array("Q")
    sorted_keys.frombytes(memoryview(keys).cast("B"))  # one copy, no bytes object in between
    sorted_offsets.frombytes(memoryview(offsets).cast("B"))
    owners = KeyMap.from_sorted(sorted_keys, sorted_offsets)  # key -> offset of the row that owns it
    return tallies, owners


class MarkTracker:
    """The mark below which every row of this run is settled: a batch's end is passed once the batch was
    handed over (`sealed`) and each of its prompts `settled`; a transient failure holds it there."""

    def __init__(self) -> None:
        self.mark: Mark | None = None
        self.held = False
        self._open: deque[list[Any]] = deque()  # [end mark, prompts left + 1 until sealed]
        self._batch_of: dict[int, list[Any]] = {}  # line of a prompt in flight -> its batch

    def batch(self, end: Mark, lines: list[int]) -> list[Any]:
        record = [end, len(lines) + 1]
        self._open.append(record)
        for line in lines:
            self._batch_of[line] = record
        return record

    def sealed(self, record: list[Any]) -> None:
        record[1] -= 1
        self._advance()

    def settled(self, line: int, ok: bool = True) -> None:
        """The prompt at `line` is settled (`ok`), or failed transiently and must be read next time."""
        record = self._batch_of.pop(line, None)
        if record is None:
            return
        if ok:
            record[1] -= 1
            self._advance()
        else:
            record[1] = -1  # never passed in this run
            self.held = True

    def _advance(self) -> None:
        while self._open and self._open[0][1] == 0:
            self.mark = self._open.popleft()[0]


class CursorKeeper:
    """Writes the cursor as the mark moves: on an interval and at the end of the run. Best effort: a
    cursor that cannot be written costs the next resume time, never this run."""

    def __init__(self, out: Path, input_path: Path, resumed: Resumed | None, samples: int = 1) -> None:
        self.path = cursor_path(out, input_path)
        self.samples = samples
        self.input = input_path
        # the file holds kept + drained pairs: those of the cursor this run started from, then this pass's
        self.kept = (resumed.owners, resumed.bad) if resumed else (0, 0)
        self.drained = (0, 0)
        self.saved: Mark | None = None
        self.saved_at = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.saved_at >= INDEX_EVERY

    def save(self, mark: Mark | None, log: CursorLog) -> None:
        """Record `mark` (of the pass `log` heard), moving the owners and bad rows logged before it to disk."""
        self.saved_at = time.monotonic()
        if mark is None or mark is self.saved:
            return
        n_owners, n_bad = mark.owners - self.drained[0], mark.bad - self.drained[1]
        new_owners, new_bad = log.owners[: 2 * n_owners], log.bad_rows[: 2 * n_bad]
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            dev, inode = input_identity(self.input)
            head = {
                "version": CURSOR_VERSION,
                "input": str(self.input.resolve()),
                "dev": dev,
                "inode": inode,
                "offset": mark.offset,
                "line": mark.line,
                "repeats": mark.repeats,
                "samples": self.samples,
                "sha256": mark.sha.hexdigest(),
                "owners": self.kept[0] + mark.owners,
                "bad": self.kept[1] + mark.bad,
                "saved": time.time(),
            }
            self.path.parent.mkdir(exist_ok=True)
            with tmp.open("wb") as f:
                f.write(orjson.dumps(head) + b"\n")
                self._copy_old(f, 0, self.kept[0] + self.drained[0])
                f.write(new_owners)  # an array writes its bytes, without a copy
                self._copy_old(f, self.kept[0] + self.drained[0], self.kept[1] + self.drained[1])
                f.write(new_bad)
            os.replace(tmp, self.path)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return
        del log.owners[: 2 * n_owners]  # the reader thread only appends: this keeps what came after
        del log.bad_rows[: 2 * n_bad]
        self.drained, self.saved = (mark.owners, mark.bad), mark

    def _copy_old(self, f: IO[bytes], skip_pairs: int, pairs: int) -> None:
        """Copy `pairs` 16-byte pairs of the current cursor file's body, after its first `skip_pairs`."""
        if pairs == 0:
            return
        _, body_at = _header(self.path)
        with self.path.open("rb") as old:
            old.seek(body_at + 16 * skip_pairs)
            f.writelines(_blocks(old, 16 * pairs))


@dataclass
class InputCursor:
    """A single-process run's input cursor: the keeper that writes it, the mark it writes, and the log of the
    pass whose bytes it vouches for."""

    keeper: CursorKeeper
    tracker: MarkTracker
    log: CursorLog

    def due(self) -> bool:
        """Whether the keeper's interval has passed."""
        return self.keeper.due()

    def save(self) -> None:
        """Write the cursor at the tracker's mark."""
        self.keeper.save(self.tracker.mark, self.log)
