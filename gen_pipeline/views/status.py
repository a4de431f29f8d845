"""`status.json` and `gen-pipeline status DIR`: how a run is doing, seen from another terminal.

While it runs, the pipeline replaces DIR/status.json every few seconds (atomically, `engine.summary.write_status`):

    {
      "updated": 1732900000.0,        # epoch seconds of this snapshot
      "last_settled": 1732899990.0,   # epoch seconds when a row was last settled (the start, before one was)
      "pid": 12345,                   # the generate process
      "state": "running",             # "running" | "stopping" (after Ctrl-C / SIGTERM) | "finished"
      "counts": {
        "done": 1200,                 # completions written by this run
        "skipped": 30,                # rows an earlier run settled
        "failed": {"timeout": 2},     # ledger entries written by this run, by reason
        "in_flight": 64,              # requests on the wire now
        "queued": 900                 # rows read but not sent yet (the reader works ahead)
      },
      "rates": {"req_per_s": 12.5, "out_tok_per_s": 4100.0},
      "eta_s": 3600.0,                # null while unknown: every row not settled yet (in flight, queued, unread)
                                      # at the rate rows settled over the last 2 minutes
      "servers": {
        "http://10.0.0.1:30000": {
          "in_flight": 8, "capacity": 64, "healthy": true, "requests": 150,
          "failures": {"timeout": 1}, # by ledger reason
          "rejected": {"invalid": 3}  # its answers the checks refused (resampled), by reason; absent: none
        }
      },
      "answers": {                    # the answers judged (send/resample.py) and those rejected so far
        "attempts": 1250, "rejected": {"invalid": 40, "degenerate": 10},
        "rejected_by_check": {"json": 38, "empty": 2, "loop": 10}, "rejected_tokens": 91000
      },
      "last_error": {"timeout": "http://10.0.0.1:30003: request timed out"},  # newest text per reason
      "alerts": ["stalled: no completion for 12m 00s"]   # what progress/alerts.py flags now (none: [])
    }

`gen-pipeline status DIR` prints it. Whether the process still runs is read from its lock: a status.json
whose writer no longer holds DIR/.lock (a worker: .lock-KKKKK), with no summary.json written after it,
means the process is gone (crashed, killed, machine rebooted): "not running (last update N s ago)", at
once. Where there is no lock file to ask (a directory written by an older version), a status.json older
than STALE_AFTER seconds means the same. Then, and when there is no status.json, the counts also come
from the files themselves (lines of completions*.jsonl, ledger reasons, rejected.jsonl by reason). A
finished run shows its summary.json. `status` exits 0 while the run is running and once it has finished
with exit code 0, and 3 (as an init script's `status` does for a program not running) when it is not
running: crashed, killed, stopped, or finished with another exit code; run the same command again to resume.

A claimed-shard run (`--shards`, `--join`, `--workers K`) is shown by claimstatus.py: one line per claimer.
A run directory of an older version whose static `--workers K` wrote status-KKKKK.json (worker i in 5
digits: status-00000.json; same schema) and summary-KKKKK.json is still shown as it was then. When
the newest status-*.json is fresher than status.json, `status` merges the workers into one view. Each
worker is judged alone by the rules above (its own summary-KKKKK.json counts as "after it", its lock is
.lock-KKKKK) and gets a line (pid, state, age, done), so a dead worker shows while the others run. Counts,
requests and failures add up over every worker: what a dead or finished worker did is on disk. The live
figures (in flight, capacity, rates, server health) come from the workers still running, or from all when
none is. A server is OUT OF SERVICE if any running worker says so. The workers share no rows, so the run ends with its
slowest worker: the ETA is the largest running worker's ETA, unknown if any of theirs is. Once a worker
has reported after .lock was last written (by the newest `generate` to start), status-*.json files older
than .lock are an earlier run's (one with more workers) and are left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.summary import merge_statuses
from ..errors import EXIT_INCOMPLETE, EXIT_OK, ConfigError
from ..inputs.kinds import input_rows
from ..progress.display import duration
from ..progress.stats import format_summary
from ..resume.ledger import ledger_reasons
from ..resume.rejects import reject_counts
from ..resume.restarts import generations, standing_lines
from ..rundir.layout import LOCK, MANIFEST, STATUS, SUMMARY, RunDir
from ..rundir.locks import holder, is_held
from .rundata import completion_files, read_json
from .statustext import ago, count_lines, render_status, status_lines

STALE_AFTER = 30.0  # seconds without an update before a run counts as not running (when no lock tells)
EXIT_RUNNING_OR_OK = EXIT_OK
EXIT_NOT_RUNNING = EXIT_INCOMPLETE  # crashed, killed, stopped or finished badly: the run wants the same command again


def file_counts(run: Path, manifest: dict[str, Any] | None) -> str:
    """What the files say, whoever wrote them."""
    files, gens = completion_files(run), generations(run)
    done = standing_lines(files, gens) if gens.newest else sum(count_lines(p) for p in files)  # restarts.py
    text = f"files: {done} completions, ledger {dict(ledger_reasons([run]))} (newest entry per id)"
    if (rejects := reject_counts([run])).answers:
        text += f", rejected.jsonl {rejects.answers} {dict(rejects.by_reason)}"
    source = Path(str((manifest or {}).get("input", "")))
    if source.is_file() and (rows := input_rows(source)) is not None:
        text += f"; the input has {rows[0]} {rows[1]}"
    return text


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def run_state(status: dict[str, Any] | None, summary_mtime: float | None, now: float, alive: bool | None = None) -> str:
    """Whether the run is "running", "finished" or "not running", from status.json, summary.json's age and
    whether its writer still holds its lock (`alive`; None: no lock file to ask, the clock decides)."""
    if status is None:
        return "finished" if summary_mtime is not None else "not running"
    updated = float(status.get("updated", 0))
    if status.get("state") == "finished" or (summary_mtime is not None and summary_mtime >= updated):
        return "finished"
    if alive is not None:
        return "running" if alive else "not running"
    return "not running" if now - updated > STALE_AFTER else "running"


def _finished_code(summary: dict[str, Any]) -> int:
    return EXIT_RUNNING_OR_OK if summary.get("exit_code") in (0, None) else EXIT_NOT_RUNNING


def _finished(run: Path, summary: dict[str, Any], now: float) -> list[str]:
    age = now - (_mtime(run / SUMMARY) or now)
    head = f"finished {duration(age)} ago, exit code {summary.get('exit_code')}"
    if summary.get("stop_reason"):
        head += f" ({summary['stop_reason']})"
    if summary.get("exit_code") not in (0, None):
        head += ": run the same command again to resume"
    try:
        return [head, format_summary(summary)]
    except (KeyError, TypeError, AttributeError):
        return [head, f"summary: completed {summary.get('completed')}, failed {summary.get('failed')}"]


def describe_run(run: Path, now: float | None = None) -> str:
    """Everything `status` prints for a run directory."""
    return inspect_run(run, now)[0]


def inspect_run(run: Path, now: float | None = None) -> tuple[str, int]:
    """What `status` prints for a run directory, and its exit code."""
    now = time.time() if now is None else now
    status, summary, manifest = (read_json(run / name) for name in (STATUS, SUMMARY, MANIFEST))
    workers = read_workers(run, now)
    empty = status is None and summary is None and manifest is None and not completion_files(run) and not workers
    if empty and not is_held(run / LOCK):  # held: a generate starting there (waiting for its servers)
        raise ConfigError(f"{run} is not a run directory (no status.json, summary.json or completions)")
    m = manifest or {}
    # no server count here: the servers listed below are the ones that count (claimers on other nodes
    # bring fleets of their own; a resume may name other servers than the manifest's)
    lines = [f"run {run}: model {m.get('model')}, input {m.get('input')}"]
    if m.get("shards") is not None:  # claimed shards: claimers on any number of hosts (claimstatus.py)
        body, code = _describe_claimed(run, summary, m, now)
    elif workers and (status is None or float(status.get("updated", 0)) < max(w.updated for w in workers)):
        body, code = _describe_workers(run, workers, summary, manifest, now)
    else:
        body, code = _describe_single(run, status, summary, manifest, now)
    return "\n".join(lines + body), code


def _describe_single(
    run: Path,
    status: dict[str, Any] | None,
    summary: dict[str, Any] | None,
    manifest: dict[str, Any] | None,
    now: float,
) -> tuple[list[str], int]:
    alive = is_held(run / LOCK)
    state = run_state(status, _mtime(run / SUMMARY) if summary else None, now, alive)
    if state == "finished" and summary is not None:
        return _finished(run, summary, now), _finished_code(summary)
    if state != "not running" and status is not None:
        return [render_status(status, now)], EXIT_RUNNING_OR_OK
    if status is None and alive:
        return [
            f"starting ({holder(run / LOCK)}): no status.json yet (finding the fleet, waiting for its servers to "
            "answer, loading the tokenizer)"
        ], EXIT_RUNNING_OR_OK
    return _not_running(run, status, manifest, now), EXIT_NOT_RUNNING


def _not_running(run: Path, status: dict[str, Any] | None, manifest: dict[str, Any] | None, now: float) -> list[str]:
    if status is None:
        lines = ["not running (no status.json): never started, or started by a version that does not write it"]
    else:
        lines = _gone(float(status.get("updated", 0)), render_status(status, now), now)
    return [*lines, file_counts(run, manifest)]


def _gone(updated: float, last_known: str, now: float) -> list[str]:
    return [
        f"not running (last update {duration(now - updated)} ago): crashed or killed; run the same command again "
        "to resume",
        "last known status:",
        last_known,
    ]


# an older version's static `generate --workers K` (its files are read, never written)


@dataclass(frozen=True)
class Worker:
    """One static worker of an older version's `generate --workers K`, as its status-KKKKK.json and
    summary-KKKKK.json show it."""

    index: int
    status: dict[str, Any]
    state: str  # run_state()'s: "running", "finished" or "not running"

    @property
    def updated(self) -> float:
        return float(self.status.get("updated", 0))


def read_workers(run: Path, now: float) -> list[Worker]:
    """The static workers of the newest --workers run of an older version, by index (none for any other run)."""
    workers = []
    rundir = RunDir(run)
    for index, path in sorted(rundir.worker_status_files().items()):
        if (status := read_json(path)) is not None:
            files = rundir.old_worker(index)
            alive = is_held(files.lock)
            workers.append(Worker(index, status, run_state(status, _mtime(files.summary), now, alive)))
    # generate writes .lock when it starts; once one worker has reported since, older files are an earlier run's
    started = _mtime(run / LOCK)
    return [w for w in workers if started is None or w.updated >= started] or workers


def merge_workers(workers: list[Worker]) -> dict[str, Any]:
    """The workers' status files as one status.json document (how each field adds up: engine.summary.STATUS_RULES)."""
    return merge_statuses([w.status for w in workers], [w.status for w in workers if w.state == "running"])


def render_workers(workers: list[Worker], now: float | None = None) -> str:
    """The merged view of a --workers run, then one line per worker."""
    now = time.time() if now is None else now
    merged = merge_workers(workers)
    running = sum(w.state == "running" for w in workers)
    head = f"{merged['state']} ({running} of {len(workers)} workers running), updated {ago(merged, now)} ago"
    return "\n".join([head, *status_lines(merged), "workers:", *(_worker_line(w, now) for w in workers)])


def _worker_line(worker: Worker, now: float) -> str:
    s = worker.status
    state = {"running": str(s.get("state", "running")), "finished": "finished"}.get(worker.state, "NOT RUNNING")
    line = (
        f"  worker {worker.index} (pid {s.get('pid')}): {state}, updated {ago(s, now)} ago, "
        f"done {(s.get('counts') or {}).get('done', 0)}"
    )
    if worker.state == "not running":
        line += ": crashed or killed; its rows wait until the same command is run again"
    return line


def _describe_workers(
    run: Path, workers: list[Worker], summary: dict[str, Any] | None, manifest: dict[str, Any] | None, now: float
) -> tuple[list[str], int]:
    newest = max(w.updated for w in workers)
    summary_mtime = _mtime(run / SUMMARY)
    if summary is not None and summary_mtime is not None and summary_mtime >= newest:
        # the parent merges summary.json once every worker has ended
        return _finished(run, summary, now), _finished_code(summary)
    if any(w.state == "running" for w in workers):
        return [render_workers(workers, now)], EXIT_RUNNING_OR_OK
    return [*_gone(newest, render_workers(workers, now), now), file_counts(run, manifest)], EXIT_NOT_RUNNING


def _describe_claimed(
    run: Path, summary: dict[str, Any] | None, manifest: dict[str, Any], now: float
) -> tuple[list[str], int]:
    from . import claimstatus

    views = claimstatus.read_claimers(run)
    summary_mtime = _mtime(run / SUMMARY)
    running = any(v.running for v in views)
    newest = max((v.updated for v in views), default=0.0)
    if not running and summary is not None and summary_mtime is not None and summary_mtime >= newest:
        left = claimstatus.open_shards(run, manifest)
        tail = [f"{left} shards open: run the same command (or submit claimers) again"] if left else []
        return [*_finished(run, summary, now), *tail], _finished_code(summary) if not left else EXIT_NOT_RUNNING
    if not views:
        return ["not running (no claimer has reported yet)", file_counts(run, manifest)], EXIT_NOT_RUNNING
    body = claimstatus.describe(run, views, manifest, now)
    if running:
        return body, EXIT_RUNNING_OR_OK
    return [*_gone(newest, "\n".join(body), now), file_counts(run, manifest)], EXIT_NOT_RUNNING
