"""Who writes where: exclusive flocks on files of a run directory, each naming its holder.

    .lock          the run directory: held by the `generate` that owns it (held shared by the claimers
                   of a claimed-shard run: shards/claims.py, which also locks each claimed shard)
    .lock-KKKKK    held by a static worker of an older version while it wrote completions-KKKKK.jsonl;
                   nothing takes it now, but a run refuses to start while an old worker still holds it

The kernel drops a flock when its holder dies, so a lock is never stale; the text in the file (pid,
shard, host) only names the holder in messages. A probe (`is_held`, used by `status` and by a run that
checks for an older version's workers) takes a shared lock for an instant, so `acquire` tries again for
ACQUIRE_RETRY seconds before it gives up: a probe never makes a writer fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from ..errors import ConfigError, OutputError
from .layout import RunDir

ACQUIRE_RETRY = 0.2  # seconds acquire keeps trying while a probe holds the lock for an instant
RETRY_STEP = 0.01
# A worker whose parent was just killed dies within milliseconds (the parent-death signal), but after the
# parent's own lock is free: a run started at once waits this long for it before refusing.
ORPHAN_WAIT = 5.0


def take_flock(fd: int, kind: int, looks_only: bool = False) -> bool:
    """Take a flock (LOCK_EX or LOCK_SH) without blocking, trying for ACQUIRE_RETRY seconds: a look (is_held,
    from `status` or a claimer looking for free shards) holds a lock shared for an instant. With `looks_only`
    (a shard's claim), give up at once when a holder other than looks has it: an exclusive one, which a shared
    lock is never granted beside."""
    deadline = time.monotonic() + ACQUIRE_RETRY
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline or (looks_only and not _only_looks(fd)):
                return False
            time.sleep(RETRY_STEP)


def _only_looks(fd: int) -> bool:
    """Whether the lock on `fd`'s file is held shared only (a shared lock is granted beside them)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


class FileLock:
    """An exclusive flock on one file, which says who holds it (`label` is added after the pid)."""

    def __init__(self, path: Path, label: str = "") -> None:
        self.path, self.label = path, label
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ConfigError naming its holder (OutputError: the file cannot be made)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot create {self.path}: {exc.strerror or exc}") from exc
        if not take_flock(fd, fcntl.LOCK_EX):
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(self.refusal(holder))
        self.fd = fd
        with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, only unnamed
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}{self.label} on {socket.gethostname()}\n".encode())

    def refusal(self, holder: str) -> str:
        """The one line that says the lock is taken."""
        return f"{self.path} is held by {holder}"

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class DirLock(FileLock):
    """One owner per run directory."""

    def __init__(self, out: Path) -> None:
        super().__init__(RunDir(out).lock_path)

    def refusal(self, holder: str) -> str:
        return f"{self.path.parent} is in use by {holder}"


def is_held(path: Path) -> bool | None:
    """Whether some process holds the lock on `path` now; None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops our shared lock at once
    return False


def holder(path: Path) -> str:
    """The text the holder wrote into a lock file ("pid N (shard i/K) on HOST")."""
    try:
        return path.read_text(errors="replace").strip() or "another process"
    except OSError:
        return "another process"


def shard_writers(out: Path) -> list[str]:
    """Who holds a .lock-KKKKK in `out` now (static workers of an older version, still writing)."""
    return [holder(p) for p in sorted(out.glob(".lock-*")) if is_held(p)]


def refuse_shard_writers(out: Path, wait: float = ORPHAN_WAIT) -> None:
    """Raise ConfigError (one line, naming each) while static workers of an older version's run still
    write in `out`; ones that are dying get `wait` seconds to finish."""
    deadline = time.monotonic() + wait
    while writers := shard_writers(out):
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{out} is still being written by a worker of an earlier run: {'; '.join(writers)}; "
                "wait for it to end or stop it, then run again"
            )
        time.sleep(0.05)
