"""`gen-pipeline status DIR` for a claimed-shard run (shards/claims.py): every claimer, the shards, the whole.

Each claimer replaces DIR/claimers/ID.json (status.json's schema, plus "claimer": its host, its Slurm
job and task, the shards it holds, when it started and the rows it completed over all its passes) and
holds DIR/claimers/ID.lock while it lives. `status` shows

  - one line per claimer of the current session (claimers whose lifetimes overlap, the newest group:
    an earlier day's claimers are left out): host, Slurm job/task, shards held, rows/s, last update;
    one whose lock is free before it finished is NOT RUNNING, one that holds it but has not written for
    STALE_AFTER seconds is flagged STALLED;
  - the shards: settled (a marker for this input), claimed (held by a running claimer), open (neither);
  - the merged figures (engine.summary.merge_statuses, one merge): counts over every claimer, load and rates
    over the running ones; the ETA is what is left of the input (its lines times the samples, less the
    completions and permanent ledger entries on disk) at the running claimers' summed rate, because
    claimers share the remaining rows (the slowest claimer does not set the run's end).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.summary import merge_statuses
from ..inputs.kinds import input_fingerprint, input_rows
from ..progress.display import duration
from ..records import TRANSIENT_REASONS
from ..resume.ledger import ledger_reasons
from ..rundir.layout import RunDir
from ..rundir.locks import is_held
from ..shards.claims import ShardTable, last_session, shard_counts
from .rundata import read_json
from .statustext import ago, count_lines, status_lines

STALE_AFTER = 30.0  # seconds without a status write before a live claimer is flagged


@dataclass(frozen=True)
class ClaimerView:
    """One claimer as its status file and its lock show it."""

    ident: str
    status: dict[str, Any]
    alive: bool  # its lock is held

    @property
    def info(self) -> dict[str, Any]:
        return dict(self.status.get("claimer") or {})

    @property
    def updated(self) -> float:
        return float(self.status.get("updated", 0))

    @property
    def started(self) -> float:
        return float(self.info.get("started") or self.updated)

    @property
    def running(self) -> bool:
        return self.alive and self.status.get("state") != "finished"


def read_claimers(run: Path) -> list[ClaimerView]:
    """The claimers of the current session (newest overlapping group), oldest start first."""
    rundir, views = RunDir(run), []
    for ident in rundir.claimers():
        files = rundir.claimer(ident)
        status = read_json(files.status)
        if status is not None:
            views.append(ClaimerView(ident, status, bool(is_held(files.lock))))
    now = time.time()  # a claimer that lives lasts until now, whenever it last wrote
    return last_session(views, lambda v: (v.started, now if v.alive else v.updated))


def shards_now(run: Path, manifest: dict[str, Any], views: list[ClaimerView]) -> dict[str, int]:
    """Shards settled (for the input as it is now), claimed by a running claimer, and open."""
    count = int(manifest.get("shards") or 0)
    source = Path(str(manifest.get("input", "")))
    samples = int(manifest.get("samples") or 1)
    fingerprint = {**input_fingerprint(source), "samples": samples} if source.is_file() else None
    table = ShardTable(RunDir(run), count, fingerprint or {})
    open_ = set(table.open_shards()) if fingerprint else _unmarked(table)
    # read from the claimers' files, not by probing the shard locks (a probe could make a claimer skip one)
    claimed = {s for v in views if v.running for s in v.info.get("shards") or []}
    return shard_counts(count, open_, claimed)


def _unmarked(table: ShardTable) -> set[int]:
    """Shards without a settled marker (the input cannot be read here to check what the markers are for)."""
    return {s for s in range(table.count) if not table.rundir.shard(s).settled.exists()}


def rows_left(run: Path, manifest: dict[str, Any]) -> tuple[int, int | None]:
    """Rows done (completions on disk) and rows still to settle (None when the input cannot be read here)."""
    done = sum(count_lines(p) for p in RunDir(run).completion_files())
    source = Path(str(manifest.get("input", "")))
    rows = input_rows(source) if source.is_file() else None
    lines = rows[0] if rows is not None else None
    if lines is None:
        return done, None
    ledgered = sum(n for reason, n in ledger_reasons([run]).items() if reason not in TRANSIENT_REASONS)
    total = lines * int(manifest.get("samples") or 1)
    return done, max(0, total - done - ledgered)


def merged(views: list[ClaimerView], left: int | None) -> dict[str, Any]:
    """The claimers' status files as one status.json document; its ETA shared by the running claimers."""
    docs = [_totals(v) for v in views]
    live = [d for d, v in zip(docs, views, strict=True) if v.running]
    doc = merge_statuses(docs, live)
    rate = float((doc.get("rates") or {}).get("req_per_s") or 0.0)
    doc["eta_s"] = 0.0 if left == 0 else (round(left / rate, 1) if left is not None and rate > 0 and live else None)
    return doc


def _totals(view: ClaimerView) -> dict[str, Any]:
    """A claimer's status with "done" over all its passes (a pass's snapshot counts that pass only)."""
    counts = {**(view.status.get("counts") or {}), "done": view.info.get("done_total", 0)}
    return {**view.status, "counts": counts}


def claimer_line(view: ClaimerView, now: float) -> str:
    """One claimer: name, host, Slurm job/task, shards held, rows/s, last update, and a flag."""
    info, s = view.info, view.status
    slurm = info.get("slurm") or {}
    where = f"host {info.get('host', '?')}"
    if slurm:
        where += f", slurm job {slurm.get('job') or slurm.get('job_id', '?')} task {slurm.get('task', '-')}"
    shards = info.get("shards") or []
    age = max(0.0, now - view.updated)
    line = (
        f"  {view.ident} ({where}): {s.get('state', 'running') if view.alive else 'ended'}, shards {_few(shards)}, "
        f"{(s.get('rates') or {}).get('req_per_s', 0)} rows/s, done {info.get('done_total', 0)}, "
        f"updated {duration(age)} ago"
    )
    if not view.alive and s.get("state") != "finished":
        line += ": NOT RUNNING (its lock is free: crashed or killed); its shards are open to any claimer"
    elif view.running and age > STALE_AFTER:
        line += f": STALLED (no update for {duration(age)} while it holds its lock)"
    return line


def _few(shards: list[int]) -> str:
    """A list of shard numbers, shortened."""
    more = f",... ({len(shards)})" if len(shards) > 8 else ""
    return ",".join(map(str, shards[:8])) + more if shards else "none"


def describe(run: Path, views: list[ClaimerView], manifest: dict[str, Any], now: float | None = None) -> list[str]:
    """The claimed-shard view: the merged figures, the shards, rows done, and one line per claimer."""
    now = time.time() if now is None else now
    done, left = rows_left(run, manifest)
    doc = merged(views, left)
    running = sum(v.running for v in views)
    sh = shards_now(run, manifest, views)
    head = f"{doc['state']} ({running} of {len(views)} claimers running), updated {ago(doc, now)} ago"
    shards = f"shards: {sh['count']} | open {sh['open']} | claimed {sh['claimed']} | settled {sh['settled']}"
    rows = f"rows done {done}" + (f", {left} to go" if left is not None else "")
    return [head, shards, rows, *status_lines(doc), "claimers:", *(claimer_line(v, now) for v in views)]


def open_shards(run: Path, manifest: dict[str, Any]) -> int:
    """Shards not settled (open or claimed)."""
    sh = shards_now(run, manifest, [])
    return sh["open"] + sh["claimed"]
