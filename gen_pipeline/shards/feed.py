"""A claimer's input: the rows of the shards it holds, claimed a batch at a time over one long run.

One Runner serves every claim of a claimer, so its fleet never drains between claims: when the read of
the input for one claim is over and its rows have all been handed to the workers, the tokenizer thread
claims the next batch (claims.batch_size: half an even split of the free shards over the live claimers)
and reads the input again for those shards, while the last claim's requests are still in flight.
A claim's shards are settled, and let go, once the input was read for them and every one of their
prompts is written or ledgered (claims.py has the protocol).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..engine.reader import BatchReader
from ..errors import OutputError
from ..inputs.rows import BadRow
from ..inputs.source import Skipped
from ..progress.stats import RunStats
from ..records import TRANSIENT_REASONS, Completion, Failure, Prompt, Rejected, RowId
from ..resume.cursor import Mark
from ..resume.settled import scan
from ..rundir.store import RunWriter
from ..tokens import TokenCounter
from .claims import Claim, ShardTable, batch_size, live_claimers, shard_of

IDLE_POLL = 0.01  # seconds between looks at the queue while the next claim waits for it to empty


class ClaimWriter:
    """RunWriter's interface over the shards a claimer holds: each record goes to its own shard's files."""

    def __init__(self, count: int, fsync_interval: float) -> None:
        self.count, self.fsync_interval = count, fsync_interval
        self.writers: dict[int, RunWriter] = {}  # added by the tokenizer thread, finished on the event loop
        self.unsettled: set[int] = set()  # shards that got a transient failure

    def add(self, held: dict[int, Claim], found: dict[str, Any], out: Path) -> None:
        """Open the files of newly claimed shards; `found`: what the resume scan read of them, by file."""
        for s, c in held.items():
            known = found.get(str(c.shard.writer.completions.relative_to(out)))
            self.writers[s] = RunWriter(c.shard.root, self.fsync_interval, known)

    def _for(self, row_id: RowId | None, line: int | None) -> tuple[int, RunWriter]:
        s = shard_of(row_id, line, self.count)
        return s, self.writers[s]

    def write_completion(self, completion: Completion) -> None:
        """Append to the completion's shard's output."""
        self._for(completion.id, None)[1].write_completion(completion)

    def write_failure(self, failure: Failure) -> None:
        """Append to the failure's shard's ledger; a transient one keeps its shard open."""
        s, writer = self._for(failure.id if failure.id is not None else failure.shard_id, failure.line)
        writer.write_failure(failure)
        if failure.reason in TRANSIENT_REASONS:
            self.unsettled.add(s)

    def write_rejected(self, rejected: Rejected) -> None:
        """Append to the answer's shard's rejected answers."""
        self._for(rejected.id, None)[1].write_rejected(rejected)

    def finish(self, shard: int) -> bool:
        """fsync and close one shard's files; whether every line reached the disk (then it may be settled)."""
        writer = self.writers.pop(shard, None)
        if writer is None:
            return False
        try:
            writer.sync()
            return writer.failed is None
        except (OSError, OutputError):  # a full disk: the shard stays open, the run reports the write error
            return False
        finally:
            writer.close()

    def sync(self) -> None:
        """Flush and fsync every shard's files."""
        for w in list(self.writers.values()):
            w.sync()

    def close(self) -> None:
        """Close every shard's files."""
        for w in list(self.writers.values()):
            w.close()
        self.writers.clear()


@dataclass
class Held:
    """One claim: its shards, its prompts not yet settled, and whether the input was read for it."""

    claims: dict[int, Claim]
    pending: int = 0
    read: bool = False


@dataclass
class ClaimFeed:
    """BatchReader's interface over a claimer's claims, one read of the input per claim."""

    config: RunConfig
    counter: TokenCounter
    stats: RunStats
    ctx: int
    table: ShardTable
    writer: ClaimWriter
    stopping: Callable[[], bool] = lambda: False  # the Runner stops: claim nothing more
    held: list[Held] = field(default_factory=list)  # claims not yet let go
    current: Held | None = None  # the claim being read
    tried: set[int] = field(default_factory=set)  # shards this process held: never taken twice
    reader: BatchReader | None = None
    started: None = None  # no input cursor: every claim reads from the top
    retired: frozenset[str] = frozenset()  # checkpoints no longer serving (engine.setup.retired_checkpoints)

    def hold_cursor(self) -> None:
        """The Runner's Feed interface: a claimer keeps no input cursor (its current read's cursor log stops
        all the same, as a single run's would)."""
        assert self.reader is not None
        self.reader.hold_cursor()

    def claim_next(self) -> bool:
        """Claim a batch of open shards and start a read of the input for them; False when none is left."""
        free = self.table.free_shards(self.tried)
        want = batch_size(len(free), live_claimers(self.table.rundir), self.table.count)
        claims = self.table.claim(want, free)
        if not claims:
            return False
        self.tried |= claims.keys()
        count = self.table.count

        def mine(key: int) -> bool:
            return key % count in claims

        resume = scan(self.config.out, repair=False, mine=mine, shards=sorted(claims))
        resume.samples, resume.turns = self.config.samples, self.config.turns == "all"
        self.writer.add(claims, resume.files, self.config.out)
        self.reader = BatchReader(
            self.config, self.counter, resume, self.stats, None, self.ctx, mine=mine, retired=self.retired
        )
        self.current = Held(claims)
        self.held.append(self.current)
        return True

    def next_batch(self) -> tuple[list[Prompt | BadRow | Skipped], Mark]:
        """The next batch of the current claim's rows; past its end, the next claim's (in the tokenizer thread)."""
        assert self.reader is not None and self.current is not None
        while True:
            batch, end = self.reader.next_batch()
            if batch:
                return batch, end
            self.current.read = True
            while self.stats.undispatched and not self.stopping():
                time.sleep(IDLE_POLL)  # claim when the rows are wanted, not while others could take the shards
            if self.stopping() or not self.claim_next():
                return batch, end

    def shards(self) -> list[int]:
        """The shards held now."""
        return sorted(s for h in self.held for s in h.claims)

    def release_all(self) -> None:
        """Let go of every claim still held (a stopped run: their shards stay open)."""
        for h in self.held:
            for s, claim in h.claims.items():
                self.writer.finish(s)
                claim.release()
        self.held = []


class ClaimTracker:
    """The Runner's Tracker for a claimer: counts each claim's prompts in flight (there is no input cursor)
    and settles a claim once they are all done."""

    def __init__(self, feed: ClaimFeed, by: str, may_settle: Callable[[], bool]) -> None:
        self.feed, self.by, self.may_settle = feed, by, may_settle
        self._held_of: dict[int, Held] = {}  # line of a prompt in flight -> its claim
        self.error: OutputError | None = None  # a settled marker that could not be written (raised at the end)

    def batch(self, end: Mark, lines: list[int]) -> list[Any]:
        """A batch was read for the current claim (the reader is between two calls: it cannot move on)."""
        held = self.feed.current
        if held is not None and lines:
            held.pending += len(lines)
            for line in lines:
                self._held_of[line] = held  # a line falls in one shard, so in one claim of this process
        return [end, 0]

    def sealed(self, record: list[Any]) -> None:
        """The batch was handed over: an older claim whose read ended may be done."""
        self.settle_done()

    def settled(self, line: int, ok: bool = True) -> None:
        """One prompt written or ledgered (a transient failure keeps its shard open: ClaimWriter.unsettled)."""
        held = self._held_of.pop(line, None)
        if held is not None:
            held.pending -= 1
            if held.pending == 0:
                self.settle_done()

    def settle_done(self) -> None:
        """Settle and let go of every claim whose read is over and whose prompts are all done."""
        done = [h for h in self.feed.held if h.read and h.pending == 0]
        for held in done:
            self.feed.held.remove(held)
            for s, claim in held.claims.items():
                synced = self.feed.writer.finish(s)
                try:
                    if synced and s not in self.feed.writer.unsettled and self.may_settle() and not self.error:
                        self.feed.table.mark_settled(s, self.by)
                except OutputError as exc:  # the shard stays open: a rerun finds its rows done and settles it
                    self.error = exc
                finally:
                    claim.release()
