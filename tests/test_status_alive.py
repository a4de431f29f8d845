"""`gen-pipeline status` asks the run's locks whether it still runs, and says so in its exit code."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e import prompts
from procs import PY, env, generate, old_worker_lock, sim_fleet, wait_for_lines
from test_report import snapshot

from gen_pipeline.engine.summary import write_status
from gen_pipeline.rundir.layout import SUMMARY, write_json_atomic
from gen_pipeline.rundir.locks import DirLock
from gen_pipeline.views.status import EXIT_NOT_RUNNING, EXIT_RUNNING_OR_OK, STATUS, inspect_run

CRASHED = "not running (last update 0 s ago): crashed or killed; run the same command again to resume"


def status_cli(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "gen_pipeline", "status", str(run)], capture_output=True, text=True, env=env())


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """A run directory whose status.json was written just now, by a process that may be gone."""
    write_status(tmp_path / STATUS, snapshot(time.time()))
    return tmp_path


def test_a_fresh_status_whose_writer_is_gone_is_not_running_at_once(fresh):
    """The lock is free: the run crashed a moment ago, however fresh its status.json (exit 3)."""
    lock = DirLock(fresh)
    lock.acquire()
    lock.release()  # as the kernel does when a process dies
    text, code = inspect_run(fresh)
    assert text.splitlines()[1] == CRASHED and code == EXIT_NOT_RUNNING


def inspect_held(run: Path, now: float | None = None) -> tuple[str, int]:
    """inspect_run while the run's lock is held, as by a live generate."""
    lock = DirLock(run)
    lock.acquire()
    try:
        return inspect_run(run, now)
    finally:
        lock.release()


def test_a_status_whose_writer_holds_the_lock_is_running(fresh):
    """The lock is held: running (exit 0)."""
    text, code = inspect_held(fresh)
    assert text.splitlines()[1].startswith("running (pid 4242), updated ") and code == EXIT_RUNNING_OR_OK


def test_a_worker_that_let_go_of_its_shard_is_not_running(fresh):
    """Two fresh worker status files: the one whose shard lock is free is NOT RUNNING, the run goes on."""
    held = old_worker_lock(fresh, 0, 2)
    held.acquire()
    gone = old_worker_lock(fresh, 1, 2)
    gone.acquire()
    gone.release()
    try:
        for i in range(2):
            write_status(fresh / f"status-0000{i}.json", snapshot(time.time() + 1, pid=100 + i))
        text, code = inspect_run(fresh)
    finally:
        held.release()
    lines = text.splitlines()
    assert lines[1].startswith("running (1 of 2 workers running)") and code == EXIT_RUNNING_OR_OK
    assert lines[-1].startswith("  worker 1 (pid 101): NOT RUNNING")


@pytest.mark.parametrize(
    ("exit_code", "code"), [(0, EXIT_RUNNING_OR_OK), (130, EXIT_NOT_RUNNING), (3, EXIT_NOT_RUNNING)]
)
def test_a_finished_run_exits_by_how_it_ended(fresh, exit_code, code):
    """Finished with exit code 0: status exits 0; stopped or incomplete: 3 (it wants the same command again)."""
    summary = {"exit_code": exit_code, "completed": 1, "failed": {}}
    write_json_atomic(fresh / SUMMARY, summary)
    text, got = inspect_run(fresh)
    assert text.splitlines()[1].startswith(f"finished 0 s ago, exit code {exit_code}") and got == code


@pytest.mark.slow
def test_status_of_a_real_run_then_of_its_crash(write_jsonl, tmp_path):
    """While generate runs, status says running (exit 0); right after kill -9, not running (exit 3)."""
    path, out = write_jsonl(prompts(400)), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.01") as servers:
        proc = generate(path, out, servers, "--concurrency", "2")
        try:
            wait_for_lines(out / "completions.jsonl", 5, 60)
            deadline = time.monotonic() + 30
            while not (out / STATUS).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            live = status_cli(out)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        dead = status_cli(out)
    assert live.returncode == 0 and f"running (pid {proc.pid})" in live.stdout, live.stdout + live.stderr
    assert dead.returncode == 3, dead.stdout + dead.stderr
    assert "crashed or killed" in dead.stdout.splitlines()[1], dead.stdout


def test_status_watch_into_a_closed_pipe_exits_quietly(fresh):
    """`status --watch | head -1`: once the reader is gone, status ends with no traceback."""
    proc = subprocess.Popen(
        [PY, "-m", "gen_pipeline", "status", str(fresh), "--watch", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"run ")
    proc.stdout.close()
    try:
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 128 + signal.SIGPIPE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert err == b"", err.decode()


@pytest.mark.parametrize(("idle", "stalled"), [(5.0, False), (130.0, True)])
def test_a_run_that_settled_nothing_for_a_while_shows_stalled_not_its_old_rate(tmp_path, idle, stalled):
    """During an outage the process lives on and keeps writing status.json, but settles no row: status
    says since when, instead of the run's average rate and an ETA from before."""
    now = time.time()
    write_status(tmp_path / STATUS, snapshot(now, last_settled=now - idle))
    text, _ = inspect_held(tmp_path, now)
    since = time.strftime("%H:%M:%S", time.localtime(now - idle))
    assert ("STALLED: no row settled for 2m 10s (since " + since + ")" in text) is stalled, text
    assert ("12.5 req/s" in text and "ETA 1h 02m" in text) is not stalled, text


def test_the_head_names_no_server_count_the_list_below_contradicts(tmp_path):
    """The manifest names 3 servers, the live status lists 2 (a resume with other --servers, or claimers
    on other nodes with fleets of their own): only the list, and its count, are shown."""
    from gen_pipeline.rundir.layout import MANIFEST

    servers = [f"http://h:3000{i}" for i in range(3)]
    write_json_atomic(tmp_path / MANIFEST, {"model": "m", "input": "in.jsonl", "servers": servers})
    write_status(tmp_path / STATUS, snapshot(time.time()))
    text, _ = inspect_held(tmp_path)
    assert text.splitlines()[0] == f"run {tmp_path}: model m, input in.jsonl", text
    assert "servers: 1 of 2 healthy" in text, text


def test_status_of_a_generate_still_waiting_for_its_servers_says_starting(write_jsonl, tmp_path):
    """While generate waits for servers to answer (up to --startup-timeout), its directory holds only the
    lock: status says starting and exits 0 (it said "not a run directory", exit 1, as if the job had failed);
    a directory with nothing at all is still no run directory."""
    from gen_pipeline.sim import free_ports

    out = tmp_path / "out"
    [port] = free_ports(1)  # nothing listens there
    proc = generate(write_jsonl(prompts(3)), out, f"127.0.0.1:{port}", "--startup-timeout", "30")
    try:
        deadline = time.monotonic() + 30
        while not (out / ".lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the lock taken
        said = status_cli(out)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert said.returncode == EXIT_RUNNING_OR_OK, said.stderr
    assert said.stdout.splitlines()[1].startswith("starting (pid"), said.stdout
    (tmp_path / "empty").mkdir()
    assert "is not a run directory" in status_cli(tmp_path / "empty").stderr
