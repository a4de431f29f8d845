"""The output file is the checkpoint: appending lines (RunWriter), a torn last line repaired, the manifest check.

Which files there are is layout.py's (RunDir); who may write them, locks.py's; what their lines settle, on
resume, resume/settled.py's (scan). A torn last line (a crash mid-write) is moved aside into `<file>.torn`,
never parsed as data.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import ManifestMismatchError, OutputError
from ..records import Completion, Failure, Rejected, id_key
from ..samples import note_generation
from .donekeys import FileKeys, IndexKeeper
from .layout import COMPLETIONS, FAILURES, REJECTED, RunDir, write_json_atomic

# Budget settings a resume may change (the rows already written keep theirs); said, not refused.
BUDGET_KEYS = ("max_tokens", "min_tokens", "safety_margin")
# Settings that change what a completion means; a resume must not mix them.
MANIFEST_KEYS = (
    "model",
    "tokenizer",
    "context_length",
    "sampling",
    "system_prompt",
    "template_sha256",  # absent without --template
    "template_inputs_sha256",
    "turns",  # absent for --turns last: the runs made before it resume as they are
)


def repair_tail(path: Path) -> int:
    """Move a torn last line (no trailing newline) into `<path>.torn`; return its size in bytes."""
    if not path.exists():
        return 0
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return 0
        start = _last_line_start(f, size)
        f.seek(start)
        torn = f.read()
        with path.with_name(path.name + ".torn").open("ab") as aside:
            aside.write(torn + b"\n")
        f.truncate(start)
    return len(torn)


def _last_line_start(f: IO[bytes], size: int) -> int:
    pos, chunk = size, 1 << 16
    while pos > 0:
        step = min(chunk, pos)
        f.seek(pos - step)
        block = f.read(step)
        nl = block.rfind(b"\n")
        if nl >= 0:
            return pos - step + nl + 1
        pos -= step
    return 0


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, object or None when the line is not a JSON object) for every line."""
    if not path.exists():
        return
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
            yield n, obj if isinstance(obj, dict) else None


def repair_all(out: Path) -> int:
    """Repair the torn tail of every output and ledger file; the bytes moved aside. A claimed shard whose file
    was torn is settled no more: its next claimer sends (or ledgers) the torn line's row again."""
    run = RunDir(out)
    moved = 0
    for path in [*run.completion_files(), *run.failure_files(), *run.rejected_files()]:
        if (torn := repair_tail(path)) and (marker := run.settled_marker_of(path)) is not None:
            marker.unlink(missing_ok=True)
        moved += torn
    return moved


def _setting(key: str, manifest: dict[str, Any]) -> Any:
    """A manifest's setting as the user gave it (a manifest leaves --turns last out: runs from before it)."""
    value = manifest.get(key)
    return "last" if key == "turns" and value is None else value


def check_manifest(out: Path, manifest: dict[str, Any], force: bool, write: bool = True) -> list[str]:
    """Refuse to resume a run made with other settings (unless forced); then record ours (if `write`).
    Returns a warning for each budget setting that changed (allowed: each line records its own max_tokens)."""
    path = RunDir(out).manifest
    old = orjson.loads(path.read_bytes()) if path.exists() else {}
    if old and not force:
        changed = [k for k in MANIFEST_KEYS if old.get(k) != manifest.get(k)]
        diffs = [f"{k}: {_setting(k, old)!r} -> {_setting(k, manifest)!r}" for k in changed]
        if diffs:
            raise ManifestMismatchError(
                f"{out} holds a run with other settings ({'; '.join(diffs)}); use another --out, or --force to mix them"
            )
    changed = [k for k in BUDGET_KEYS if k in old and old[k] != manifest.get(k)]
    moved = [f"--{k.replace('_', '-')} {old[k]} -> {manifest.get(k)}" for k in changed]
    if write:
        write_json_atomic(path, manifest)
    if not moved:
        return []
    return [
        f"{'; '.join(moved)} since this directory's earlier rows: the manifest records this run's, each line "
        "the max_tokens it was sent with"
    ]


class RunWriter:
    """Appends completions and ledger entries, one flushed line per write, fsync on an interval (in a thread)."""

    def __init__(self, out: Path, fsync_interval: float, found: FileKeys | None = None) -> None:
        """The single writer's files of run directory `out` (a claimed shard's writer passes the shard's
        folder); `found`: what the resume scan read of our completions file, to keep its index current."""
        self.fsync_interval = fsync_interval
        self._files: dict[str, IO[bytes]] = {}
        self._last_sync = time.monotonic()
        self.failed: OutputError | None = None  # after one failed write, nothing more is written
        self._out = out
        self._fsync_thread: ThreadPoolExecutor | None = None
        self._fsyncing: Future[None] | None = None
        files = RunDir(out).writer()
        for name, path in ((COMPLETIONS, files.completions), (FAILURES, files.failures)):
            try:
                self._files[name] = path.open("ab")
            except OSError as exc:
                raise OutputError(f"cannot open {path}: {exc}") from exc
        completions = self._files[COMPLETIONS]
        at = completions.tell()
        if found is None and at == 0:
            found = FileKeys(Path(completions.name), array("Q"), [], 0, 0, complete=True)
        # only when the scan saw the whole file as it is now (it was repaired before we opened it)
        usable = found is not None and found.complete and found.size == at
        self.index = IndexKeeper(found) if usable and found is not None else None

    def write_completion(self, completion: Completion) -> None:
        line = completion.to_line()
        self._append(COMPLETIONS, line)
        if self.index is not None:
            self.index.add(completion.key, len(line))
            if completion.restart:
                place = (completion.sample, 0, completion.restart)
                note_generation(self.index.found.restarts, id_key(completion.id), place)

    def write_failure(self, failure: Failure) -> None:
        self._append(FAILURES, failure.to_line())

    def write_rejected(self, rejected: Rejected) -> None:
        """Append one rejected answer (the file is made on the first)."""
        if REJECTED not in self._files and self.failed is None:
            path = RunDir(self._out).writer().rejected
            try:
                self._files[REJECTED] = path.open("ab")
            except OSError as exc:
                self.failed = OutputError(f"cannot open {path}: {exc.strerror or exc}")
                raise self.failed from exc
        self._append(REJECTED, rejected.to_line())

    def _append(self, name: str, line: bytes) -> None:
        if self.failed is not None:
            raise self.failed
        f = self._files[name]
        try:
            f.write(line)
            f.flush()
            if time.monotonic() - self._last_sync >= self.fsync_interval:
                self._sync_behind()
        except OSError as exc:
            self.failed = OutputError(f"cannot write {f.name}: {exc.strerror or exc}")
            raise self.failed from exc

    def _sync_behind(self) -> None:
        """fsync both files in the writer's own thread, one fsync at a time; now and then, record the index.

        Every line is already in the file (flushed) when its write returns, which is what a crash of this
        process needs; fsync is for a crash of the machine. It can take from 0.1 ms to seconds (ext4 commits
        other files' dirty data with ours; network filesystems), and on the event loop it would hold up every
        request for that long. While one runs, the next waits for its turn."""
        self._last_sync = time.monotonic()
        if self._fsyncing is not None:
            if not self._fsyncing.done():
                return
            self._settle_fsync()
        if self._fsync_thread is None:
            self._fsync_thread = ThreadPoolExecutor(1, thread_name_prefix="gen-pipeline-fsync")
        self._fsyncing = self._fsync_thread.submit(self._fsync_files)
        self._save_index_when_due()

    def _fsync_files(self) -> None:
        for f in list(self._files.values()):  # rejected.jsonl may be opened meanwhile
            os.fsync(f.fileno())

    def _settle_fsync(self) -> None:
        """Wait for the fsync in flight, if any; if it failed, so does the writer (OutputError)."""
        pending, self._fsyncing = self._fsyncing, None
        exc = pending.exception() if pending is not None else None
        if exc is not None:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self.failed = OutputError(f"cannot fsync the output in {self._out}: {detail}")
            raise self.failed from exc

    def sync(self) -> None:
        """Flush and fsync both files now (after the fsync in flight); now and then, record the index."""
        self._settle_fsync()
        for f in self._files.values():
            f.flush()
        self._fsync_files()
        self._last_sync = time.monotonic()
        self._save_index_when_due()

    def _save_index_when_due(self) -> None:
        if self.index is not None and self.index.due():
            self.index.save()

    def close(self) -> None:
        with contextlib.suppress(OSError, OutputError):
            self.sync()
            if self.index is not None and self.failed is None:
                self.index.save()
        if self._fsync_thread is not None:
            self._fsync_thread.shutdown(wait=True)
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
