"""`status.json` and `gen-pipeline status DIR`: how a run is doing, seen from another terminal.

While it runs, the pipeline replaces DIR/status.json every few seconds (atomically, `write_status`):

    {
      "updated": 1732900000.0,        # epoch seconds of this snapshot
      "pid": 12345,                   # the generate process
      "state": "running",             # "running" | "stopping" (after Ctrl-C / SIGTERM) | "finished"
      "counts": {
        "done": 1200,                 # completions written by this run
        "skipped": 30,                # rows an earlier run settled
        "failed": {"timeout": 2},     # ledger entries written by this run, by reason
        "in_flight": 64               # requests on the wire now
      },
      "rates": {"req_per_s": 12.5, "out_tok_per_s": 4100.0},
      "eta_s": 3600.0,                # null while unknown
      "servers": {
        "http://10.0.0.1:30000": {
          "in_flight": 8, "capacity": 64, "healthy": true, "requests": 150,
          "failures": {"timeout": 1}  # by ledger reason
        }
      },
      "last_error": {"timeout": "http://10.0.0.1:30003: request timed out"}   # newest text per reason
    }

`gen-pipeline status DIR` prints it. A status.json older than STALE_AFTER seconds, with no summary.json
written after it, means the process is gone (crashed, killed, machine rebooted): "not running (last
update N s ago)". Then, and when there is no status.json, the counts also come from the files
themselves (lines of completions*.jsonl, ledger reasons). A finished run shows its summary.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .progress import format_summary
from .report import completion_files, ledger_reasons, read_json
from .store import MANIFEST, SUMMARY, write_json_atomic

STATUS = "status.json"
STALE_AFTER = 30.0  # seconds without an update before a run counts as not running
CHUNK = 1 << 20


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Replace status.json in one step, so a reader never sees half of it."""
    write_json_atomic(path, status)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s} s"


def _server_line(url: str, s: dict[str, Any]) -> str:
    health = "healthy" if s.get("healthy", True) else "OUT OF SERVICE"
    return (
        f"  {url}  in flight {s.get('in_flight', 0)}/{s.get('capacity', '?')}  {health}  "
        f"requests {s.get('requests', 0)}  failures {s.get('failures') or {}}"
    )


def render_status(status: dict[str, Any], now: float | None = None) -> str:
    """A status.json snapshot as readable lines."""
    now = time.time() if now is None else now
    counts, rates = status.get("counts") or {}, status.get("rates") or {}
    failed = counts.get("failed") or {}
    eta = status.get("eta_s")
    servers = status.get("servers") or {}
    healthy = sum(bool(s.get("healthy", True)) for s in servers.values())
    lines = [
        f"{status.get('state', 'running')} (pid {status.get('pid')}), updated "
        f"{_duration(max(0.0, now - float(status.get('updated', now))))} ago",
        f"done {counts.get('done', 0)} | skipped {counts.get('skipped', 0)} | "
        f"failed {f'{sum(failed.values())} {failed}' if failed else 0} | "
        f"in flight {counts.get('in_flight', 0)}",
        f"{rates.get('req_per_s', 0)} req/s | {rates.get('out_tok_per_s', 0)} out tok/s | "
        f"ETA {_duration(eta) if eta is not None else 'unknown'}",
        f"servers: {healthy} of {len(servers)} healthy",
    ]
    lines += [_server_line(url, s) for url, s in servers.items()]
    lines += [f"last {reason}: {text}" for reason, text in (status.get("last_error") or {}).items()]
    return "\n".join(lines)


def count_lines(path: Path) -> int:
    """Newlines in a file, read in chunks (completions files are large)."""
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            n += chunk.count(b"\n")
    return n


def file_counts(run: Path, manifest: dict[str, Any] | None) -> str:
    """What the files say, whoever wrote them."""
    done = sum(count_lines(p) for p in completion_files(run))
    text = f"files: {done} completions, ledger {dict(ledger_reasons(run))} (newest entry per id)"
    source = Path(str((manifest or {}).get("input", "")))
    if source.is_file():
        text += f"; the input has {count_lines(source)} lines"
    return text


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def run_state(status: dict[str, Any] | None, summary_mtime: float | None, now: float) -> str:
    """Whether the run is "running", "finished" or "not running", from status.json, summary.json's age and the clock."""
    if status is None:
        return "finished" if summary_mtime is not None else "not running"
    updated = float(status.get("updated", 0))
    if status.get("state") == "finished" or (summary_mtime is not None and summary_mtime >= updated):
        return "finished"
    return "not running" if now - updated > STALE_AFTER else "running"


def _finished(run: Path, summary: dict[str, Any], now: float) -> list[str]:
    age = now - (_mtime(run / SUMMARY) or now)
    head = f"finished {_duration(age)} ago, exit code {summary.get('exit_code')}"
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
    now = time.time() if now is None else now
    status, summary, manifest = (read_json(run / name) for name in (STATUS, SUMMARY, MANIFEST))
    if status is None and summary is None and manifest is None and not completion_files(run):
        raise ConfigError(f"{run} is not a run directory (no status.json, summary.json or completions)")
    m = manifest or {}
    lines = [f"run {run}: model {m.get('model')}, input {m.get('input')}, {len(m.get('servers') or [])} servers"]
    state = run_state(status, _mtime(run / SUMMARY) if summary else None, now)
    if state == "finished" and summary is not None:
        lines += _finished(run, summary, now)
    elif state != "not running" and status is not None:
        lines.append(render_status(status, now))
    else:
        lines += _not_running(run, status, manifest, now)
    return "\n".join(lines)


def _not_running(run: Path, status: dict[str, Any] | None, manifest: dict[str, Any] | None, now: float) -> list[str]:
    if status is None:
        lines = ["not running (no status.json): never started, or started by a version that does not write it"]
    else:
        age = _duration(now - float(status.get("updated", 0)))
        lines = [
            f"not running (last update {age} ago): crashed or killed; run the same command again to resume",
            "last known status:",
            render_status(status, now),
        ]
    return [*lines, file_counts(run, manifest)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `status` flags."""
    parser.add_argument("dir", type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="print again every SECONDS until Ctrl-C")


def main(args: argparse.Namespace) -> int:
    """Print the run's status (once, or every --watch seconds)."""
    print(describe_run(args.dir))
    if not args.watch:
        return 0
    try:
        while True:
            time.sleep(args.watch)
            print(f"\n{describe_run(args.dir)}")
    except KeyboardInterrupt:
        return 0
