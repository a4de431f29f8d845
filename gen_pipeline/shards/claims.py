"""Claimed shards: any number of `generate` processes, on any hosts, share one run directory.

The contract (docs/how-to/slurm.md, "Many nodes"): the run's input is split into V virtual shards by the stable id
hash (shard = id key mod V; a row without an id: its line number mod V). V is fixed when the run
directory is created and recorded in manifest.json as "shards". A claimer

  1. holds a shared flock on DIR/.lock for as long as it runs (a `generate` without --join takes it
     exclusively first, so it is refused while anyone else runs there, then shares it);
  2. claims a shard by a non-blocking exclusive flock on DIR/shards/SSSSS/.claim: the kernel (or the
     filesystem's lock manager) drops it when the claimer dies, so a claim is never stale;
  3. repairs the shard's torn tail, reads what its files hold, and sends the shard's rows that are not
     settled; only the holder ever writes DIR/shards/SSSSS/{completions,failures}.jsonl;
  4. writes DIR/shards/SSSSS/settled.json (atomically) once every row of the shard is done or
     permanently ledgered, for this input (its size and mtime: a grown input reopens the shards);
  5. lets go of the claim and claims the next open shard, until none is left to claim.

Resume and resubmission go by content key only: no job id, task number, host or line number is part
of any identity. Claimers are named (host, pid, start) only so `status` can show them.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import random
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, OutputError
from ..inputs.rows import BadRow
from ..inputs.shape import RowShape
from ..inputs.source import PromptSource
from ..records import RowId, id_key
from ..rundir.layout import RunDir, ShardDir, make_dir, write_json_atomic
from ..rundir.locks import FileLock, is_held, take_flock
from ..rundir.store import repair_tail

DEFAULT_SHARDS = 256
MAX_SHARDS = 100_000  # five digits in a shard's folder name
BATCH_SHARE = 16  # one claim takes at most 1/16 of the shards, so late claimers still find work
SLURM_ENV = {"job": "SLURM_ARRAY_JOB_ID", "task": "SLURM_ARRAY_TASK_ID", "job_id": "SLURM_JOB_ID"}
SLURM_ENV["node"] = "SLURMD_NODENAME"


def shard_of(row_id: RowId | None, line: int | None, count: int) -> int:
    """The shard a row falls in: its id key mod `count` (its line number when it has no id)."""
    return (id_key(row_id) if row_id is not None else int(line or 0)) % count


def run_shards(manifest: Path, asked: int | None) -> int:
    """V: the manifest's when the run directory has one (a different --shards is refused), else `asked` or
    the default."""
    recorded = None
    with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError):
        recorded = orjson.loads(manifest.read_bytes()).get("shards")
    if recorded is not None:
        if asked is not None and asked != recorded:
            raise ConfigError(
                f"{manifest.parent} was created with --shards {recorded}; it cannot change (asked {asked})"
            )
        return int(recorded)
    count = DEFAULT_SHARDS if asked is None else asked
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"--shards must be from 1 to {MAX_SHARDS}")
    return count


class SharedRunLock:
    """DIR/.lock held shared by every claimer; a `generate` without --join first takes it alone."""

    def __init__(self, out: Path, join: bool) -> None:
        self.path, self.join = out / ".lock", join
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (shared), or raise ConfigError: someone runs here and we did not ask to join, or an
        earlier version's run holds it alone."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot create {self.path}: {exc.strerror or exc}") from exc
        if not take_flock(fd, fcntl.LOCK_SH if self.join else fcntl.LOCK_EX):
            os.close(fd)
            hint = (
                "it is written by a run that does not share it" if self.join else "add --join to claim shards beside it"
            )
            raise ConfigError(f"{self.path.parent} is in use by another generate; {hint}")
        if not self.join:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} (claimer) on {socket.gethostname()}\n".encode())
            fcntl.flock(fd, fcntl.LOCK_SH)  # from here on, joiners are welcome
        self.fd = fd

    def release(self) -> None:
        """Let go (closing the file drops it)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class Claim:
    """One shard this process holds: its files and the lock's open file."""

    shard: ShardDir
    fd: int

    def release(self) -> None:
        """Let go of the shard (closing the file drops the lock)."""
        os.close(self.fd)


@dataclass
class ShardTable:
    """The V shards of one run directory: which are settled, and claiming them."""

    rundir: RunDir
    count: int
    fingerprint: dict[str, Any]
    reopen: bool = False  # --retry-failed: a settled shard may hold rows to send again

    def settled(self, index: int) -> bool:
        """Whether shard `index` is settled for this input."""
        if self.reopen:
            return False
        try:
            marker = orjson.loads(self.rundir.shard(index).settled.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return False
        return bool(marker.get("input") == self.fingerprint)

    def open_shards(self) -> list[int]:
        """The shards not settled."""
        return [s for s in range(self.count) if not self.settled(s)]

    def try_claim(self, index: int) -> Claim | None:
        """Shard `index` claimed, its torn tails repaired; None when another process holds it or settled it."""
        shard = self.rundir.shard(index)
        try:
            shard.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(shard.lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot create {shard.lock}: {exc.strerror or exc}") from exc
        if not take_flock(fd, fcntl.LOCK_EX, looks_only=True):
            os.close(fd)
            return None
        if self.settled(index):  # settled by its holder between our look and our lock
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        for path in (shard.writer.completions, shard.writer.failures):
            repair_tail(path)  # its last holder died mid-line: only the holder may cut it
        return Claim(shard, fd)

    def free_shards(self, skip: Iterable[int] = ()) -> list[int]:
        """Open shards no process holds now, less `skip`."""
        skipped = set(skip)
        return [s for s in self.open_shards() if s not in skipped and not is_held(self.rundir.shard(s).lock)]

    def claim(self, want: int, candidates: list[int]) -> dict[int, Claim]:
        """Up to `want` of `candidates`, tried from a random place so claimers spread out."""
        start = random.randrange(len(candidates)) if candidates else 0
        held: dict[int, Claim] = {}
        for s in candidates[start:] + candidates[:start]:
            if len(held) >= want:
                break
            if (claim := self.try_claim(s)) is not None:
                held[s] = claim
        return held

    def mark_settled(self, index: int, by: str, empty: bool = False) -> None:
        """Write shard `index`'s settled marker (atomically); `empty`: no row of the input falls in it."""
        marker = {"input": self.fingerprint, "time": time.time(), "by": by, **({"empty": True} if empty else {})}
        write_json_atomic(self.rundir.shard(index).settled, marker)

    def settle_empty(self, path: Path, by: str, shape: RowShape | None = None) -> None:
        """Settle, without a pass, the open shards no row of the input at `path` falls in: a night's few new
        rows reopen only the shards they fall in (`shape`: the run's, which may make a row's id)."""
        open_ = set(self.open_shards())
        for s in sorted(open_ - input_shards(path, self.count, open_, shape)):
            if (claim := self.try_claim(s)) is not None:
                try:
                    self.mark_settled(s, by, empty=True)
                finally:
                    claim.release()

    def held_by_others(self) -> list[int]:
        """Open shards some process holds now."""
        return [s for s in self.open_shards() if is_held(self.rundir.shard(s).lock)]


def shard_counts(count: int, open_: Iterable[int], claimed: Iterable[int]) -> dict[str, int]:
    """Of `count` shards: settled, claimed (open and held by a claimer) and open (neither), as a claimed-shard
    run's summary.json and `status` show them."""
    still = set(open_)
    held = still.intersection(claimed)
    return {"count": count, "settled": count - len(still), "claimed": len(held), "open": len(still - held)}


class _AllFound(Exception):
    """Every shard looked for holds a row: the rest of the input need not be read."""


def input_shards(path: Path, count: int, wanted: set[int], shape: RowShape | None = None) -> set[int]:
    """The shards of `wanted` that a row of the input falls in, as a pass assigns them (reading stops once
    every one of them does, so a large input is read only a little way)."""
    found: set[int] = set()

    def note(key: int) -> bool:
        found.add(key % count)
        if wanted <= found:
            raise _AllFound
        return False  # nothing more is done with the row

    if wanted:
        with contextlib.suppress(_AllFound):
            for item in PromptSource(path, None, note, shape=shape):
                if isinstance(item, BadRow):  # a line too long to read an id from: its line number decides
                    found.add(item.line % count)
    return found & wanted


def batch_size(free: int, live: int, count: int) -> int:
    """How many shards one claim takes: half of an even split of the free ones (open, held by nobody) over
    the live claimers (the last ones go one at a time, so no claimer holds the run's end), at most 1/16 of
    the shards."""
    return max(1, min(math.ceil(free / (2 * max(live, 1))), max(1, count // BATCH_SHARE)))


@dataclass
class Claimer:
    """This process as one claimer of a run directory: registered (a lock held while it lives) for `status`."""

    rundir: RunDir
    ident: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{int(time.time()):x}")
    lock: FileLock | None = None
    started: float = field(default_factory=time.time)

    def register(self) -> None:
        """Take this claimer's lock (the kernel drops it when the process dies)."""
        files = self.rundir.claimer(self.ident)
        make_dir(files.lock.parent)
        self.lock = FileLock(files.lock)
        self.lock.acquire()

    def release(self) -> None:
        """Unregister."""
        if self.lock is not None:
            self.lock.release()

    def info(self, held: Iterable[int]) -> dict[str, Any]:
        """Who this claimer is and what it holds, for its status file."""
        slurm = {k: os.environ[v] for k, v in SLURM_ENV.items() if v in os.environ}
        host = socket.gethostname()
        return {"id": self.ident, "host": host, "slurm": slurm, "shards": sorted(held), "started": self.started}


def live_claimers(rundir: RunDir) -> int:
    """Claimers whose process still lives (their lock is held)."""
    return sum(bool(is_held(rundir.claimer(c).lock)) for c in rundir.claimers())


def last_session(items: list[Any], span: Any) -> list[Any]:
    """The items whose (start, end) spans chain-overlap into the group that ends last, by start."""
    group: list[Any] = []
    end = float("-inf")
    for item in sorted(items, key=lambda i: span(i)[0]):
        start, stop = span(item)
        group = [*group, item] if start <= end else [item]
        end = max(end, stop) if len(group) > 1 else stop
    return group
