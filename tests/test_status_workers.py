"""`gen-pipeline status` on a `generate --workers K` run: status-KKKKK.json files merged into one view."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from e2e import prompts
from procs import PY, env, generate, sim_fleet

from gen_pipeline.engine.summary import merge_summaries, write_status
from gen_pipeline.progress.stats import format_summary
from gen_pipeline.rundir.layout import LOCK, MANIFEST, SUMMARY, write_json_atomic
from gen_pipeline.views.status import STALE_AFTER, STATUS, describe_run

NOW = 1_700_000_000.0
A, B = "http://h:30000", "http://h:30001"
HEAD = "run {run}: model m, input prompts.jsonl"


def server(in_flight: int, healthy: bool, requests: int, failures: dict[str, int]) -> dict:
    """One server's entry in a worker's status file (each worker holds half of the capacity 64)."""
    return {"in_flight": in_flight, "capacity": 32, "healthy": healthy, "requests": requests, "failures": failures}


def worker0(updated: float, **kw) -> dict:
    """Worker 0's status file, as the pipeline writes it."""
    return {
        "updated": updated,
        "pid": 101,
        "state": "running",
        "counts": {"done": 120, "skipped": 3, "failed": {"timeout": 2}, "in_flight": 16},
        "rates": {"req_per_s": 12.5, "out_tok_per_s": 4100.0},
        "eta_s": 3725,
        "servers": {A: server(10, True, 90, {}), B: server(6, True, 40, {"timeout": 2})},
        "last_error": {"timeout": "http://h:30001: request timed out"},
        **kw,
    }


def worker1(updated: float, **kw) -> dict:
    """Worker 1's status file: it saw server B go out of service."""
    return {
        "updated": updated,
        "pid": 102,
        "state": "running",
        "counts": {"done": 80, "skipped": 1, "failed": {"timeout": 1, "connection": 4}, "in_flight": 12},
        "rates": {"req_per_s": 8.25, "out_tok_per_s": 2900.5},
        "eta_s": 1800,
        "servers": {A: server(12, True, 70, {"timeout": 1}), B: server(0, False, 20, {"connection": 4})},
        "last_error": {"timeout": "an older timeout", "connection": "http://h:30001: cannot connect"},
        **kw,
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory with a manifest and one completions shard per worker (3 + 2 lines)."""
    out = tmp_path / "out"
    out.mkdir()
    write_json_atomic(out / MANIFEST, {"model": "m", "input": "prompts.jsonl", "servers": [A, B]})
    (out / "completions-00000.jsonl").write_bytes(b'{"id": 1}\n' * 3)
    (out / "completions-00001.jsonl").write_bytes(b'{"id": 2}\n' * 2)
    return out


def write_worker(run: Path, index: int, status: dict) -> None:
    """status-KKKKK.json as worker `index` writes it."""
    write_status(run / f"status-{index:05d}.json", status)


def touch(path: Path, mtime: float, content: dict | None = None) -> None:
    """Write `path` (if content is given) and set its modification time."""
    if content is not None:
        write_json_atomic(path, content)
    os.utime(path, (mtime, mtime))


MERGED_BODY = [
    "done 200 | skipped 4 | failed 7 {'timeout': 3, 'connection': 4} | in flight 28",
    "20.75 req/s | 7000.5 out tok/s | ETA 1h 02m",
    "servers: 1 of 2 healthy",
    f"  {A}  in flight 22/64  healthy  requests 160  failures {{'timeout': 1}}",
    f"  {B}  in flight 6/64  OUT OF SERVICE  requests 60  failures {{'timeout': 2, 'connection': 4}}",
    "last timeout: http://h:30001: request timed out",
    "last connection: http://h:30001: cannot connect",
    "workers:",
]


def test_two_fresh_workers_are_merged(run):
    """Counts, rates and servers add up; ETA is the slowest worker's; one worker's outage marks the server."""
    write_worker(run, 0, worker0(NOW - 2))
    write_worker(run, 1, worker1(NOW - 5))
    assert describe_run(run, now=NOW).splitlines() == [
        HEAD.format(run=run),
        "running (2 of 2 workers running), updated 2 s ago",
        *MERGED_BODY,
        "  worker 0 (pid 101): running, updated 2 s ago, done 120",
        "  worker 1 (pid 102): running, updated 5 s ago, done 80",
    ]


def test_a_stale_worker_is_shown_not_running(run):
    """A worker silent for longer than STALE_AFTER is NOT RUNNING; live figures come from the others only."""
    write_worker(run, 0, worker0(NOW - 2))
    write_worker(run, 1, worker1(NOW - 95))
    assert STALE_AFTER < 95
    assert describe_run(run, now=NOW).splitlines() == [
        HEAD.format(run=run),
        "running (1 of 2 workers running), updated 2 s ago",
        "done 200 | skipped 4 | failed 7 {'timeout': 3, 'connection': 4} | in flight 16",
        "12.5 req/s | 4100.0 out tok/s | ETA 1h 02m",
        "servers: 2 of 2 healthy",  # the dead worker's view of server B is 95 s old
        f"  {A}  in flight 10/32  healthy  requests 160  failures {{'timeout': 1}}",
        f"  {B}  in flight 6/32  healthy  requests 60  failures {{'timeout': 2, 'connection': 4}}",
        "last timeout: http://h:30001: request timed out",
        "last connection: http://h:30001: cannot connect",
        "workers:",
        "  worker 0 (pid 101): running, updated 2 s ago, done 120",
        "  worker 1 (pid 102): NOT RUNNING, updated 1m 35s ago, done 80: crashed or killed; "
        "its rows wait until the same command is run again",
    ]


def test_a_worker_that_wrote_its_summary_is_finished_not_dead(run):
    """An old status file with summary-KKKKK.json after it is a worker that ended, not one that crashed."""
    write_worker(run, 0, worker0(NOW - 2))
    write_worker(run, 1, worker1(NOW - 95))
    touch(run / "summary-00001.json", NOW - 94, {"completed": 80})
    lines = describe_run(run, now=NOW).splitlines()
    assert lines[1] == "running (1 of 2 workers running), updated 2 s ago"
    assert lines[-1] == "  worker 1 (pid 102): finished, updated 1m 35s ago, done 80"


def test_one_unknown_eta_makes_the_run_eta_unknown(run):
    """The run ends with its slowest worker, so a worker without an estimate leaves the run without one."""
    write_worker(run, 0, worker0(NOW - 2))
    write_worker(run, 1, worker1(NOW - 5, eta_s=None))
    assert describe_run(run, now=NOW).splitlines()[3] == "20.75 req/s | 7000.5 out tok/s | ETA unknown"


def test_every_worker_stale_is_not_running_with_file_counts(run):
    """With no worker left, the run is not running: last known merged view, every worker, what the files hold."""
    write_worker(run, 0, worker0(NOW - 95))
    write_worker(run, 1, worker1(NOW - 100))
    assert describe_run(run, now=NOW).splitlines() == [
        HEAD.format(run=run),
        "not running (last update 1m 35s ago): crashed or killed; run the same command again to resume",
        "last known status:",
        "running (0 of 2 workers running), updated 1m 35s ago",
        *MERGED_BODY,
        "  worker 0 (pid 101): NOT RUNNING, updated 1m 35s ago, done 120: crashed or killed; "
        "its rows wait until the same command is run again",
        "  worker 1 (pid 102): NOT RUNNING, updated 1m 40s ago, done 80: crashed or killed; "
        "its rows wait until the same command is run again",
        "files: 5 completions, ledger {} (newest entry per id)",
    ]


def test_a_finished_workers_run_shows_the_merged_summary_as_a_single_run_does(run, tmp_path):
    """summary.json written after every worker's last status: the same lines a single-process run prints."""
    parts = [
        {
            "completed": n,
            "skipped": {"done": 1},
            "failed": {},
            "finish_reasons": {"stop": n},
            "input_tokens": 10 * n,
            "output_tokens": 40 * n,
            "token_drift": {"compared": n, "differed": 0, "by_offset": {}},
            "servers": {A: {"requests": n, "completions": n, "failures": {}, "capacity": 32, "mean_latency_s": 0.5}},
        }
        for n in (4, 3)
    ]
    summary = merge_summaries(parts, elapsed=2.0, exit_code=0)
    for i, part in enumerate(parts):
        write_worker(run, i, {**worker0(NOW - 30), "state": "finished"})
        touch(run / f"summary-{i:05d}.json", NOW - 30, part)
    touch(run / SUMMARY, NOW - 29, summary)
    single = tmp_path / "single"
    single.mkdir()
    write_json_atomic(single / MANIFEST, {"model": "m", "input": "prompts.jsonl", "servers": [A, B]})
    write_status(single / STATUS, {**worker0(NOW - 30), "state": "finished"})
    touch(single / SUMMARY, NOW - 29, summary)
    text = describe_run(run, now=NOW)
    assert text.splitlines()[1:] == describe_run(single, now=NOW).splitlines()[1:]
    assert text == "\n".join([HEAD.format(run=run), "finished 29 s ago, exit code 0", format_summary(summary)])
    assert "completed 7 | skipped 2 {'done': 2} | failed 0" in text


def test_a_fresher_status_json_wins_over_old_worker_files(run):
    """Resumed by one process after a --workers run: status.json is newer, so the single view shows."""
    write_worker(run, 0, worker0(NOW - 600))
    write_status(run / STATUS, worker1(NOW - 1, pid=7))
    assert describe_run(run, now=NOW).splitlines()[1] == "running (pid 7), updated 1 s ago"


def test_worker_files_older_than_the_lock_are_an_earlier_runs(run):
    """Resumed with fewer workers: status-00002.json predates this run's .lock and is not a dead worker."""
    touch(run / LOCK, NOW - 60, {})
    write_worker(run, 0, worker0(NOW - 2))
    write_worker(run, 1, worker1(NOW - 5))
    write_worker(run, 2, worker1(NOW - 3600, pid=103))
    lines = describe_run(run, now=NOW).splitlines()
    assert lines[1] == "running (2 of 2 workers running), updated 2 s ago"
    assert "pid 103" not in "\n".join(lines)


def test_worker_files_all_older_than_the_lock_are_still_the_last_known_run(run):
    """A generate that took the lock and failed before any worker reported hides nothing: the old run shows."""
    touch(run / LOCK, NOW - 60, {})
    write_worker(run, 0, worker0(NOW - 95))
    write_worker(run, 1, worker1(NOW - 100))
    lines = describe_run(run, now=NOW).splitlines()
    assert lines[1] == "not running (last update 1m 35s ago): crashed or killed; run the same command again to resume"
    assert lines[3] == "running (0 of 2 workers running), updated 1m 35s ago"


def test_workers_finished_without_the_merged_summary(run):
    """Every worker wrote its summary but the parent never merged summary.json: finished workers, run not running."""
    for i, status in enumerate((worker0(NOW - 40), worker1(NOW - 50))):
        write_worker(run, i, {**status, "state": "finished", "counts": {**status["counts"], "in_flight": 0}})
        touch(run / f"summary-{i:05d}.json", NOW - 39, {"completed": 1})
    lines = describe_run(run, now=NOW).splitlines()
    assert lines[1:4] == [
        "not running (last update 40 s ago): crashed or killed; run the same command again to resume",
        "last known status:",
        "finished (0 of 2 workers running), updated 40 s ago",
    ]
    assert lines[-3:] == [
        "  worker 0 (pid 101): finished, updated 40 s ago, done 120",
        "  worker 1 (pid 102): finished, updated 50 s ago, done 80",
        "files: 5 completions, ledger {} (newest entry per id)",
    ]


def test_status_cli_prints_the_merged_view(run):
    """`python -m gen_pipeline status DIR`, run as a user does, prints the merged view."""
    now = time.time()
    write_worker(run, 0, worker0(now))
    write_worker(run, 1, worker1(now - 1))  # older, so worker 0's timeout text is the newest
    proc = subprocess.run([PY, "-m", "gen_pipeline", "status", str(run)], capture_output=True, text=True, env=env())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == HEAD.format(run=run)
    assert lines[1].startswith("running (2 of 2 workers running), updated ")
    assert lines[2:10] == MERGED_BODY
    assert [line.split(":")[0] for line in lines[10:]] == ["  worker 0 (pid 101)", "  worker 1 (pid 102)"]


@pytest.mark.slow
def test_status_during_a_real_workers_run(write_jsonl, tmp_path):
    """While `generate --workers 2` runs, status merges both claimers' files; after Ctrl-C, none runs."""
    path, out = write_jsonl(prompts(600)), tmp_path / "out"
    status = [PY, "-m", "gen_pipeline", "status", str(out)]
    with sim_fleet(2, "--token-latency", "0.005") as servers:
        proc = generate(path, out, servers, "--workers", "2", "--shards", "8", "--concurrency", "4")
        try:
            deadline = time.monotonic() + 60
            while len(list((out / "claimers").glob("*[!y].json"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # both claimers have written a status (not a summary: *-summary.json)
            live = subprocess.run(status, capture_output=True, text=True, env=env(), timeout=60)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert live.returncode == 0, live.stderr
    assert "running (2 of 2 claimers running)" in live.stdout, live.stdout
    assert "servers: 2 of 2 healthy" in live.stdout and "shards: 8 | open " in live.stdout, live.stdout
    assert live.stdout.count(" rows/s, done ") == 2, live.stdout
    after = subprocess.run(status, capture_output=True, text=True, env=env(), timeout=60)
    assert "finished" in after.stdout and "exit code 130" in after.stdout, after.stdout
    summary = orjson.loads((out / SUMMARY).read_bytes())
    assert f"completed {summary['completed']} " in after.stdout
