"""The run directory: every path in it, who writes which file, the lock, and atomic JSON writes.

    DIR/
      manifest.json             the settings that make two runs comparable; resuming with others is refused
      .lock                     held (flock) by the process that runs here (the parent under --workers)
      completions.jsonl         a single-process run's output: one line per finished prompt
      failures.jsonl            its ledger: one line per failure; the newest entry per id decides
      rejected.jsonl            every answer the checks or the loop guard rejected, one line each (made on the
                                first; a claimed shard keeps its own beside its output)
      status.json summary.json  its live snapshot and its last figures
      completions-KKKKK.jsonl   an older version's files, read on resume and by `status`, never written: what
      failures-KKKKK.jsonl      static worker K of its `generate --workers` wrote (output, ledger, status,
      status-KKKKK.json ...     summary); .lock-KKKKK is the lock it held while it wrote (a run refuses to
                                start while one is still held)
      shards/SSSSS/             claimed shard S (shards/claims.py): .claim (its lock), completions.jsonl,
                                failures.jsonl, settled.json (its marker, once every row in it is settled)
      claimers/ID.json          a claimer's live status; ID.lock held while it lives; ID-summary.json
      .index/                   resume caches (deleting it is always safe)

Every set of files one process appends to is a `Writer`; nothing outside this module builds a file name,
so a new layout (claimed shards, one folder each) is a new `Writer` constructor here and nowhere else.
The locks themselves (flock, who holds them) are locks.py's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError

MANIFEST = "manifest.json"
LOCK = ".lock"
INDEX_DIR = ".index"
COMPLETIONS = "completions.jsonl"
FAILURES = "failures.jsonl"
REJECTED = "rejected.jsonl"
STATUS = "status.json"
SUMMARY = "summary.json"
SHARDS_DIR = "shards"
CLAIMERS_DIR = "claimers"
CLAIM_LOCK = ".claim"
SETTLED = "settled.json"
# completions-00003.jsonl, status-00003.json, ...: what static worker 3 of an older version's `--workers K`
# wrote; read on resume and by `status`, never written
_WORKER_FILE = re.compile(r"(completions|failures|status|summary)-(\d{5})\.(jsonl|json)")


@dataclass(frozen=True)
class Writer:
    """The files one writing process owns: its output, its ledger, its status and its summary."""

    completions: Path
    failures: Path
    status: Path
    summary: Path
    lock: Path  # held while the files are written
    rejected: Path  # the answers rejected (send/resample.py)


@dataclass(frozen=True)
class OldWorker:
    """What static worker `index` of an older version's `--workers K` left besides its output and ledger
    (those are found by `completion_files` and `failure_files`): names to read, never to write."""

    status: Path
    summary: Path
    lock: Path  # held while it wrote; nothing takes it now, but a run refuses to start while it is held


@dataclass(frozen=True)
class ShardDir:
    """The files of claimed shard `index`: written only by the process that holds `lock`."""

    index: int
    root: Path
    lock: Path
    settled: Path
    writer: Writer


@dataclass(frozen=True)
class ClaimerFiles:
    """One claimer's files: its lock (held while it lives), its live status and its summary."""

    lock: Path
    status: Path
    summary: Path


class RunDir:
    """One run directory and the names of everything in it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.manifest = self.root / MANIFEST
        self.lock_path = self.root / LOCK
        self.index_dir = self.root / INDEX_DIR

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def writer(self) -> Writer:
        """The files of the run's single writer (a claimed shard's are `shard(index).writer`)."""
        return self._writer(self.root, self.lock_path)

    def old_worker(self, index: int) -> OldWorker:
        """The status, summary and lock names of static worker `index` of an older version (read only)."""
        tag = f"-{index:05d}"
        status, summary = (self.root / n.replace(".", f"{tag}.", 1) for n in (STATUS, SUMMARY))
        return OldWorker(status, summary, self.root / f"{LOCK}{tag}")

    def shard(self, index: int) -> ShardDir:
        """The folder and files of claimed shard `index`."""
        root = self.root / SHARDS_DIR / f"{index:05d}"
        return ShardDir(index, root, root / CLAIM_LOCK, root / SETTLED, self._writer(root, root / CLAIM_LOCK))

    @staticmethod
    def _writer(root: Path, lock: Path) -> Writer:
        return Writer(root / COMPLETIONS, root / FAILURES, root / STATUS, root / SUMMARY, lock, root / REJECTED)

    def claimer(self, ident: str) -> ClaimerFiles:
        """The files of the claimer named `ident` (host, pid and start time: a name, never an identity of rows)."""
        d = self.root / CLAIMERS_DIR
        return ClaimerFiles(d / f"{ident}.lock", d / f"{ident}.json", d / f"{ident}-summary.json")

    def claimers(self) -> list[str]:
        """Every claimer that left a status file or a summary (one that found nothing to claim), by name."""
        return sorted({p.stem.removesuffix("-summary") for p in (self.root / CLAIMERS_DIR).glob("*.json")})

    def settled_marker_of(self, path: Path) -> Path | None:
        """The settled marker of the claimed shard that `path` is a file of (None: not a shard's file)."""
        return path.parent / SETTLED if path.parent.parent == self.root / SHARDS_DIR else None

    def shard_roots(self) -> list[Path]:
        """The folders of the claimed shards that exist."""
        return sorted(p for p in (self.root / SHARDS_DIR).glob("[0-9]" * 5) if p.is_dir())

    def completion_files(self, shards: Iterable[int] | None = None) -> list[Path]:
        """Every output file that exists: the single writer's, the static workers' by number, then the claimed
        shards' (only those of `shards`, when given)."""
        return self._existing("completions", shards)

    def failure_files(self, shards: Iterable[int] | None = None) -> list[Path]:
        """Every ledger file that exists, in the same order."""
        return self._existing("failures", shards)

    def rejected_files(self, shards: Iterable[int] | None = None) -> list[Path]:
        """Every rejected-answers file that exists, in the same order."""
        return self._existing("rejected", shards)

    def worker_status_files(self) -> dict[int, Path]:
        """The status file of each worker that wrote one, by worker number."""
        return {w: p for w, p in self._workers("status").items() if p.exists()}

    def stale_worker_reports(self) -> list[Path]:
        """Workers' status and summary files (a new --workers run removes an earlier run's)."""
        return sorted([*self._workers("status").values(), *self._workers("summary").values()])

    def _existing(self, kind: str, shards: Iterable[int] | None = None) -> list[Path]:
        single = getattr(self.writer(), kind)
        workers = [p for _, p in sorted(self._workers(kind).items())]
        numbers = [int(r.name) for r in self.shard_roots()] if shards is None else list(shards)
        claimed = [getattr(self.shard(n).writer, kind) for n in numbers]
        return [p for p in [single, *workers, *claimed] if p.exists()]

    def _workers(self, kind: str) -> dict[int, Path]:
        found = {}
        for path in self.root.glob(f"{kind}-*"):
            match = _WORKER_FILE.fullmatch(path.name)
            if match is not None and match[1] == kind:
                found[int(match[2])] = path
        return found


_TMP = re.compile(r"[\w.-]+\.json\.\d+\.tmp")  # write_json_atomic's temporary files


def read_manifest(run: Path) -> dict[str, Any]:
    """A run directory's manifest.json ({} when it has none)."""
    path = RunDir(run).manifest
    return orjson.loads(path.read_bytes()) if path.exists() else {}


def make_dir(path: Path) -> Path:
    """Create a directory of the run, parents included; OutputError (one line, exit 5) when the filesystem
    refuses it (read-only, full, no permission), as it would refuse a file in an existing one."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {path}: {_not_a_directory(path) or exc.strerror or exc}") from exc
    return path


# What a start-up writes before any row: a start-up that fails leaves only these in a directory it made.
STARTUP_FILES = (LOCK, MANIFEST)


@contextlib.contextmanager
def made_for_run(out: Path) -> Iterator[Path]:
    """The run directory `out`, made (parents included) for the block; when the block fails before the run
    wrote a row there, what it made is taken away again (a start-up failure, such as no server answering,
    leaves no empty run directory behind). A directory that existed before is never touched."""
    made = [p for p in (out, *out.parents) if not p.exists()]  # the deepest first
    make_dir(out)
    try:
        yield out
    except BaseException:
        with contextlib.suppress(OSError):
            _unmake(made)
        raise


def _unmake(made: list[Path]) -> None:
    """Remove the directories in `made` (deepest first) while they hold nothing but a start-up's files."""
    for path in made:
        if any(p.name not in STARTUP_FILES for p in path.iterdir()):
            return
        for name in STARTUP_FILES:
            (path / name).unlink(missing_ok=True)
        path.rmdir()


def _not_a_directory(path: Path) -> str | None:
    """Why `path` or a folder above it cannot be a directory (mkdir says only "File exists"), if one cannot."""
    for p in (*reversed(path.parents), path):
        if p.is_symlink():
            try:
                os.stat(p)
            except FileNotFoundError:
                return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return f"{p} is a symbolic link that loops ({os.readlink(p)})"
        if p.exists() and not p.is_dir():
            return f"{p} is a file, not a directory"
    return None


def sweep_temporary_files(run: Path) -> None:
    """Remove the temporary files write_json_atomic leaves when it is killed mid-write; only for a process
    that holds the run directory alone (another writer's may be in use)."""
    for path in run.glob("*.json.*.tmp"):
        if _TMP.fullmatch(path.name):
            path.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replace a JSON file in one step, so a crash leaves the old or the new one whole."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # claimers on many hosts may replace one file
    try:
        tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # a full disk: the part written is nobody's
        raise OutputError(f"cannot write {path}: {exc}") from exc
