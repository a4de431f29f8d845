"""The output file is the checkpoint: appending lines, reading them back on resume, the manifest check.

Which files there are is layout.py's (RunDir); who may write them, locks.py's. On open, existing lines
are scanned into compact key sets; a torn last line (a crash mid-write) is moved aside into `<file>.torn`,
never parsed as data.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import ManifestMismatchError, OutputError
from ..records import PERMANENT_REASONS, REJECT_REASONS, Completion, Failure, Rejected, Spent, id_key
from ..samples import note_generation, place_key, record_place, restart_key, row_reason
from .donekeys import FileKeys, IndexKeeper, KeyMap, KeySet, completion_keys, union
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


class SettledRows:
    """One pass over the input against the resume state: is this id settled, and which row owns it?

    `owner` asks, in turn, the owners of an input cursor's prefix (`prior`: the pass starts after it), the
    resume state, and the rows this pass met. `visit` answers the resume state's part with one lookup and
    remembers where the first row with a settled id stood, so a later row with that id can be compared with
    it: 8 bytes per done id, in an array beside the KeySet (a dict of offsets took ~80 bytes a row, 50 MB at
    650k rows).
    """

    def __init__(self, state: ResumeState, retry: frozenset[str], prior: KeyMap | None = None) -> None:
        self.state, self.retry, self.prior = state, retry, prior
        self.offsets = array("Q", bytes(8 * len(state.done)))  # offset + 1; 0 = not met yet
        self.other: dict[int, int] = {}  # ids settled by a permanent ledger reason (few)
        self.seen = KeyMap()  # the other ids: key -> offset of the row that owns it, ~20 bytes a row

    def owner(self, key: int, offset: int) -> tuple[int | None, str | None]:
        """(offset of the row that owns this id, or None when the row at `offset` is its first), and why
        that first row needs no request or None (inputs.source.Owners)."""
        if self.prior is not None and (owner := self.prior.get(key)) is not None:
            return owner, None
        reason, owner = self.visit(key, offset)
        if owner is not None:
            return owner, None
        if reason is None and (owner := self.seen.first(key, offset)) is not None:
            return owner, None
        return None, reason

    def visit(self, key: int, offset: int) -> tuple[str | None, int | None]:
        """(why the id is settled or None, the offset of the row that owns it or None); the first row
        with a settled id becomes its owner."""
        i = self.state.done.position(key)
        if i >= 0:
            before = self.offsets[i]
            if before:
                return "done", before - 1
            self.offsets[i] = offset + 1
            return self.state.row_settled(key, self.retry), None
        reason = self.state.row_settled(key, self.retry)
        if reason is None:
            return None, None
        before_other = self.other.get(key)
        if before_other is None:
            self.other[key] = offset
        return reason, before_other


@dataclass
class ResumeState:
    """What earlier runs in this directory already settled."""

    done: KeySet = field(default_factory=KeySet)
    last_reason: dict[int, str] = field(default_factory=dict)
    bad_lines: set[tuple[str, int]] = field(default_factory=set)
    corrupt_lines: list[str] = field(default_factory=list)
    torn_bytes: int = 0
    files: dict[str, FileKeys] = field(default_factory=dict)  # output file name -> what it holds
    samples: int = 1  # the run's --samples: a row is settled when all of them are
    later_samples_ledgered: bool = False  # a ledger entry names a sample or turn > 0 (the cursor checks key 0 only)
    turns: bool = False  # --turns all: a row's settledness needs its turns (the row parsed: engine.reader._settle)
    rejects: dict[int, Spent] = field(default_factory=dict)  # key not done -> its rejected answers (rejected.jsonl)
    restarts: dict[int, int] = field(default_factory=dict)  # sample_key -> newest restart generation (samples.py)

    def generation(self, key: int) -> int:
        """The newest restart generation of the (id, sample) whose sample_key is `key` (0: none)."""
        return self.restarts.get(key, 0) if self.restarts else 0

    def settled(self, key: int, retry: frozenset[str]) -> str | None:
        """Why this (id, sample) key needs no request now ("done", or its permanent reason), or None."""
        if key in self.done:
            return "done"
        reason = self.last_reason.get(key)
        if reason in PERMANENT_REASONS and reason not in retry:
            return reason
        return None

    def row_settled(self, key: int, retry: frozenset[str]) -> str | None:
        """Why the row with id key `key` needs no request now (each of its --samples settled), or None
        (always under --turns all: how many turns a conversation has is known only from its row)."""
        if self.turns:
            return None
        if self.samples == 1:
            return self.settled(restart_key(key, self.generation(key)), retry)
        return row_reason(self, key, self.samples, retry)

    def rows(self, retry: frozenset[str], prior: KeyMap | None = None) -> SettledRows:
        """A pass over the input (`--retry-failed` reasons count as not settled), after an input cursor's
        prefix whose owners are `prior`."""
        return SettledRows(self, retry, prior)


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


def scan(
    out: Path,
    repair: bool = True,
    mine: Callable[[int], bool] | None = None,
    save_index: bool = True,
    shards: Iterable[int] | None = None,
) -> ResumeState:
    """Read every output and ledger file into compact key sets.

    `repair=False` only reads (check, and worker processes whose parent repaired). `mine(key)` keeps only
    one worker's ids of the ledger; the output's keys are all kept (a sample's key does not tell its
    row's shard, and another worker's keys are never asked about). With several ledger files the newest
    entry per (id, sample) (by its `time`) decides. Output files are read from where `donekeys`' index
    says the last read ended (`save_index`: move that mark). `shards`: of the claimed shards' files, read
    only these (a claimer's keys are in its shards' files and the top-level ones, never in another shard's).
    """
    state = ResumeState()
    if repair:
        state.torn_bytes = repair_all(out)
    done = array("Q")
    for path in RunDir(out).completion_files(shards):
        found = completion_keys(path, save_index)
        state.files[str(path.relative_to(out))] = found
        state.corrupt_lines += [f"{path.relative_to(out)}:{n}" for n in found.corrupt]
        done = union(done, found.keys)
        for plain, restart in found.restarts.items():
            note_generation(state.restarts, plain, (0, 0, restart))  # (a sample_key is sample 0's own key)
    state.done = KeySet(done, presorted=True)
    del done
    newest: dict[int, float] = {}
    ledgered: dict[int, float] = {}  # key -> its newest ledger entry for rejected answers (a new round after it)
    for path in RunDir(out).failure_files(shards):
        for n, obj in iter_json_lines(path):
            if obj is None or "reason" not in obj:
                state.corrupt_lines.append(f"{path.relative_to(out)}:{n}")
            elif obj["reason"] == "bad_input" and obj.get("line") is not None:
                state.bad_lines.add((str(obj.get("source")), int(obj["line"])))
            elif obj.get("id") is not None and (place := record_place(obj)) is not None:
                row, when = id_key(obj["id"]), float(obj.get("time") or 0.0)
                key = place_key(row, *place)
                state.later_samples_ledgered |= place != (0, 0, 0)
                note_generation(state.restarts, row, place)
                if (mine is None or mine(row)) and when >= newest.get(key, float("-inf")):
                    newest[key], state.last_reason[key] = when, obj["reason"]
                if obj["reason"] in REJECT_REASONS:
                    ledgered[key] = max(when, ledgered.get(key, float("-inf")))
    state.rejects = spent(out, state.done, ledgered, mine, shards)
    return state


def spent(
    out: Path, done: KeySet, ledgered: dict[int, float], mine: Callable[[int], bool] | None, shards: Any
) -> dict[int, Spent]:
    """The rejected answers of each key not done (rejected.jsonl read back): how many, how many since the key
    was last ledgered for them (the bound's round), and the last one."""
    found: dict[int, Spent] = {}
    for path in RunDir(out).rejected_files(shards):
        for _, obj in iter_json_lines(path):
            place = record_place(obj) if obj is not None and obj.get("id") is not None else None
            if obj is None or place is None:
                continue
            row = id_key(obj["id"])
            key = place_key(row, *place)
            if key in done or (mine is not None and not mine(row)):
                continue
            total, rounds = found[key][:2] if key in found else (0, 0)
            fresh = float(obj.get("time") or 0.0) > ledgered.get(key, float("-inf"))
            reason, check = str(obj.get("reason") or "invalid"), str(obj.get("check") or "")
            found[key] = Spent(total + 1, rounds + fresh, reason, check, str(obj.get("detail") or ""))
    return found


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
