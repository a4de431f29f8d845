"""How much work the input holds, counted beside the run: the progress bar's total and the ETA's.

The units are progress/work.py's: a row per line (times its samples) under --turns last, its user turns
(times its samples) under --turns all; a line that is no valid row is one unit (its ledger entry). The
count reads the input once more, from the top, in a thread of its own that begins once the run has
settled its first row (or after START_WAIT seconds), so it never competes with the run's start. Under
--turns last it counts line ends a block at a time and parses only the rare rows that set their own
samples; under --turns all it parses and shapes each row as the reader does (consecutive user turns merged,
then split_turns). Within --limit it counts
the first N lines. Rows before an input cursor are counted apart: they are the ones a resume hands over as
tallies. A compressed input is decompressed again. Of the other inputs (inputs/kinds.py), Parquet and Arrow
give their row count from their metadata (under --turns last); CSV, a JSON array, a dataset, or an input
that cannot be read to its end get no total (the bar then shows a count alone, as before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..config import RunConfig
from ..errors import InputError
from ..inputs.file import STREAM_ERRORS, compression, open_stream
from ..inputs.kinds import open_reader
from ..inputs.readers import RowReader
from ..inputs.rows import RowError, own_samples, parse_row
from ..inputs.shape import RowShape
from ..progress.work import Work
from ..send.turns import split_turns

log = logging.getLogger("gen_pipeline")

COUNT_BLOCK = 1 << 20
START_WAIT = 30.0  # seconds the count waits for the run's first settled row before it begins anyway
START_POLL = 0.05


def start_count(config: RunConfig, cursor: int, work: Work, started: Callable[[], bool]) -> threading.Thread:
    """Count the input's units in a daemon thread once `started()` (the run has settled a row);
    `work.counted` gets them unless `work.stop` is set first."""
    args = (config, cursor, work, started)
    thread = threading.Thread(target=_count_into, args=args, name="gen-pipeline-count", daemon=True)
    thread.start()
    return thread


def _count_into(config: RunConfig, cursor: int, work: Work, started: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_WAIT
    while not started() and time.monotonic() < deadline:
        if work.stop.wait(START_POLL):
            return
    tally = Tally(
        config.turns == "all", config.samples, config.limit, cursor, RowShape.of(config.template, config.turns)
    )
    try:
        reader = open_reader(config.input)
        found = tally.count(config, work.stop) if reader is None else tally.rows_of(reader)
    except (InputError, *STREAM_ERRORS) as exc:  # the reader says why, where it matters
        log.debug("no total for the progress bar: %s", exc)
        return
    if found is not None and not work.stop.is_set():
        work.counted(*found)


@dataclass
class Tally:
    """Units of an input read a block at a time: in all, and in the lines before byte `cursor`."""

    turns_all: bool
    samples: int
    limit: int | None
    cursor: int
    shape: RowShape | None = None  # the run's --template and --turns, as the reader shapes each row
    units: int = 0
    lines: int = 0
    before: int = 0

    def count(self, config: RunConfig, stop: threading.Event) -> tuple[int, int] | None:
        """(units before the cursor, units in all), or None when stopped first."""
        pos, rest = 0, b""
        with open_stream(config.input, compression(config.input)) as f:
            while block := f.read(COUNT_BLOCK):
                if stop.is_set():
                    return None
                data = rest + block
                end = data.rfind(b"\n") + 1
                whole, rest = data[:end], data[end:]
                if not self.add(whole, pos):
                    return self.before, self.units
                pos += len(whole)
        self.add(rest, pos)  # a last line without a line end
        return self.before, self.units

    def rows_of(self, reader: RowReader) -> tuple[int, int] | None:
        """(units before the cursor, units in all) of an input another reader reads (Parquet, Arrow: the
        row count its metadata has), or None when that takes reading it (CSV, a JSON array, a dataset) or
        under --turns all (a row's turns are known only from the row)."""
        try:
            rows = None if self.turns_all else reader.rows()
        finally:
            reader.close()
        if rows is None:
            return None
        rows = rows if self.limit is None else min(rows, self.limit)
        before = min(self.cursor, rows) if reader.by_rows else 0  # a row reader's cursor is a row number
        return before * self.samples, rows * self.samples

    def add(self, chunk: bytes, pos: int) -> bool:
        """Count the whole lines of `chunk`, which starts at byte `pos`; False once --limit is reached."""
        room = None if self.limit is None else self.limit - self.lines
        lines = chunk.count(b"\n") + (not chunk.endswith(b"\n") and bool(chunk))
        if room is not None and lines >= room:
            chunk = b"\n".join(chunk.split(b"\n", room)[:room]) + b"\n"
            lines = room
        if pos < self.cursor < pos + len(chunk):  # the input cursor lies in this chunk, at a line's start
            cut = self.cursor - pos
            self.units += self.units_of(chunk[:cut])
            self.before = self.units
            self.units += self.units_of(chunk[cut:])
        else:
            self.units += self.units_of(chunk)
            if pos + len(chunk) <= self.cursor:
                self.before = self.units
        self.lines += lines
        return room is None or lines < room

    def units_of(self, chunk: bytes) -> int:
        """The units of whole lines (blank lines are no rows)."""
        if self.turns_all:
            return sum(self.row_units(line) for line in chunk.split(b"\n") if line.strip())
        lines = chunk
        while b"\n\n" in lines:  # rare: blank lines
            lines = lines.replace(b"\n\n", b"\n")
        rows = lines.count(b"\n") - lines.startswith(b"\n") + (not lines.endswith(b"\n") and bool(lines.strip()))
        units = rows * self.samples
        if own_samples(chunk):  # rare: parse only the lines that may set their own samples
            units += sum(self.row_units(line) - self.samples for line in chunk.split(b"\n") if own_samples(line))
        return units

    def row_units(self, line: bytes) -> int:
        """One row's units, as the reader will settle them; a bad row's one ledger entry."""
        try:
            prompt = parse_row(line, 0, self.shape)  # consecutive user turns merged, as they are sent
            k = prompt.samples or self.samples
            return k * len(split_turns(prompt.messages)) if self.turns_all else k
        except RowError:
            return 1 if self.turns_all else self.samples
