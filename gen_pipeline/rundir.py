"""The run directory: every path in it, who writes which file, the lock, and atomic JSON writes.

    DIR/
      manifest.json             the settings that make two runs comparable; resuming with others is refused
      .lock                     held (flock) by the process that runs here (the parent under --workers)
      .lock-KKKKK               held by worker K while it writes its files
      completions.jsonl         a single-process run's output: one line per finished prompt
      failures.jsonl            its ledger: one line per failure; the newest entry per id decides
      status.json summary.json  its live snapshot and its last figures
      completions-KKKKK.jsonl   worker K of `generate --workers` (failures-, status-, summary- likewise)
      .index/                   resume caches (deleting it is always safe)

Every set of files one process appends to is a `Writer`; nothing outside this module builds a file name,
so a new layout (claimed shards, one folder each) is a new `Writer` constructor here and nowhere else.
The locks themselves (flock, who holds them) are locks.py's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import OutputError

MANIFEST = "manifest.json"
LOCK = ".lock"
INDEX_DIR = ".index"
COMPLETIONS = "completions.jsonl"
FAILURES = "failures.jsonl"
STATUS = "status.json"
SUMMARY = "summary.json"
# completions-00003.jsonl, status-00003.json, ...: what worker 3 of `--workers K` writes
_WORKER_FILE = re.compile(r"(completions|failures|status|summary)-(\d{5})\.(jsonl|json)")


@dataclass(frozen=True)
class Writer:
    """The files one writing process owns: its output, its ledger, its status and its summary."""

    completions: Path
    failures: Path
    status: Path
    summary: Path
    lock: Path  # held while the files are written
    worker: int | None = None  # None: the run's only writer (or the parent of --workers)


class RunDir:
    """One run directory and the names of everything in it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.manifest = self.root / MANIFEST
        self.lock_path = self.root / LOCK
        self.index_dir = self.root / INDEX_DIR

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def writer(self, worker: int | None = None) -> Writer:
        """The files of the run's single writer, or of worker `worker` of `--workers K`."""
        tag = "" if worker is None else f"-{worker:05d}"
        c, f, st, su = (self.root / n.replace(".", f"{tag}.", 1) for n in (COMPLETIONS, FAILURES, STATUS, SUMMARY))
        return Writer(c, f, st, su, self.root / f"{LOCK}{tag}", worker)

    def completion_files(self) -> list[Path]:
        """Every output file that exists, the single writer's first, then the workers' by number."""
        return self._existing("completions")

    def failure_files(self) -> list[Path]:
        """Every ledger file that exists, in the same order."""
        return self._existing("failures")

    def worker_status_files(self) -> dict[int, Path]:
        """The status file of each worker that wrote one, by worker number."""
        return {w: p for w, p in self._workers("status").items() if p.exists()}

    def stale_worker_reports(self) -> list[Path]:
        """Workers' status and summary files (a new --workers run removes an earlier run's)."""
        return sorted([*self._workers("status").values(), *self._workers("summary").values()])

    def _existing(self, kind: str) -> list[Path]:
        single = getattr(self.writer(), kind)
        workers = [p for _, p in sorted(self._workers(kind).items())]
        return [p for p in [single, *workers] if p.exists()]

    def _workers(self, kind: str) -> dict[int, Path]:
        found = {}
        for path in self.root.glob(f"{kind}-*"):
            match = _WORKER_FILE.fullmatch(path.name)
            if match is not None and match[1] == kind:
                found[int(match[2])] = path
        return found


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replace a JSON file in one step, so a crash leaves the old or the new one whole."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc}") from exc
