"""generate --workers K: workers die with their parent, and no two writers ever share a file.

Real processes: a parent killed with SIGKILL (alone, with its process group, or after one of its
workers) leaves no worker writing, and a resume started at once writes every id exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from e2e import check_invariant, prompts
from procs import (
    PY,
    alive,
    children,
    env,
    generate_argv,
    kill_all,
    run_generate,
    sim_fleet,
    wait_for_done,
    wait_gone,
)

from gen_pipeline.config import API_KEY_ENV, RunConfig
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.shards.workers import without_api_key, worker_argv, worker_env

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process trees from /proc")
KEY = "sk-test-0123456789"
GONE_WITHIN = 10.0  # seconds; they go in milliseconds, the margin is for a loaded machine


def start(argv: list[str], stderr: Path) -> subprocess.Popen[bytes]:
    """A generate in a session of its own, so that its process group can be killed alone."""
    with stderr.open("wb") as err:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env(), start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["parent", "group", "worker then parent"])
def test_workers_die_with_their_parent_and_a_resume_at_once_is_exact(write_jsonl, tmp_path, kill):
    """kill -9 of the parent (or its group): its workers are gone within seconds and an immediate resume
    ends with every id exactly once, none lost; the API key was on no worker's command line."""
    rows = prompts(800)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.01") as servers:
        argv = generate_argv(path, out, servers, "--workers", "2", "--concurrency", "2", "--api-key", KEY)
        parent = start(argv, tmp_path / "stderr")
        workers = children(parent.pid, 2, 60)
        try:
            wait_for_done(out, 20, 60)
            for pid in workers:
                assert KEY not in Path(f"/proc/{pid}/cmdline").read_text()
                assert f"{API_KEY_ENV}={KEY}" in Path(f"/proc/{pid}/environ").read_text()
            if kill == "worker then parent":
                os.kill(workers[0], signal.SIGKILL)
            if kill == "group":
                os.killpg(parent.pid, signal.SIGKILL)
            else:
                os.kill(parent.pid, signal.SIGKILL)
            parent.wait(timeout=30)
            assert wait_gone(workers, GONE_WITHIN) == [], "workers outlived their parent"
            again = run_generate(path, out, servers, "--workers", "2")
        finally:
            kill_all([p for p in workers if alive(p)])
    assert again.returncode == 0, again.stderr
    assert check_invariant([r["id"] for r in rows], out) == {"done": 800, "ledger": 0}


@pytest.mark.slow
def test_a_resume_is_refused_while_an_older_versions_worker_still_writes(write_jsonl, tmp_path):
    """A static worker of an older version that outlived its run keeps its shard lock; a resume, one
    process or --workers, is refused in one line naming its pid and shard, and writes nothing."""
    path, out = write_jsonl(prompts(10)), tmp_path / "out"
    out.mkdir()
    hold = (
        "import sys; from pathlib import Path; from gen_pipeline.rundir.locks import FileLock\n"
        "FileLock(Path(sys.argv[1]), ' (shard 1/2)').acquire(); print('held', flush=True); sys.stdin.read()"
    )
    lock = RunDir(out).old_worker(1).lock
    worker = subprocess.Popen([PY, "-c", hold, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "held\n"
        for extra in ([], ["--workers", "2"]):
            resume = run_generate(path, out, "127.0.0.1:1", *extra, timeout=60)
            assert resume.returncode == 1, resume.stderr
            assert len(resume.stderr.splitlines()) == 1, resume.stderr
            assert f"pid {worker.pid} (shard 1/2)" in resume.stderr
        assert not (out / "completions.jsonl").exists() and not (out / "shards").exists()
    finally:
        worker.communicate(timeout=30)


def test_a_worker_whose_parent_is_already_gone_writes_nothing(write_jsonl, tmp_path):
    """A worker that starts after its parent died (the pipe is closed) exits 130 before it claims or writes."""
    path, out = write_jsonl(prompts(5)), tmp_path / "out"
    read_end, write_end = os.pipe()
    os.close(write_end)
    argv = generate_argv(path, out, "127.0.0.1:1", "--join", "--parent-fd", str(read_end), progress="off")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env(), pass_fds=(read_end,), timeout=60)
    finally:
        os.close(read_end)
    assert done.returncode == 130, done.stderr
    assert "parent process is gone" in done.stderr
    assert not out.exists()  # not even its shard lock


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--api-key", KEY, "--input", "x"],
        ["generate", f"--api-key={KEY}", "--input", "x"],
        ["generate", "--api", KEY, "--input", "x"],
        ["generate", f"--api-k={KEY}", "--input", "x"],
    ],
)
def test_the_api_key_is_never_on_a_workers_command_line(argv, tmp_path):
    """However it was spelled, the key leaves the worker's argv and travels in its environment."""
    assert without_api_key(argv) == ["generate", "--input", "x"]
    assert KEY not in " ".join(worker_argv(argv, 1, 2, 7))
    config = RunConfig(input=tmp_path / "x", out=tmp_path, servers=("http://h:1",), api_key=KEY)
    assert worker_env(config)[API_KEY_ENV] == KEY
