"""run/slurm/ under a real Slurm: a controller and two nodes on this machine (run/slurm/local-cluster.sh).

Skipped with a reason where Slurm is not installed (or not root), unless GEN_PIPELINE_SLURM=1 (CI), where that
is a failure. A cluster already running (SLURM_CONF set, as .ci/run does) is used; else one is started here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from e2e import check_invariant, prompts
from procs import PY, env, wait_for_done

from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.shards.claims import shard_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "run" / "slurm"
TINY = ROOT / "gen_pipeline" / "data" / "tiny-tokenizer"
SHARDS = 16
ARRAY_DEADLINE = 90.0


def missing() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    absent = [c for c in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(c) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} not found; .ci/run installs it)"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd)"
    return None


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a Slurm client talking to a running local cluster (this module's, unless CI's)."""
    reason = missing()
    if reason:
        if os.environ.get("GEN_PIPELINE_SLURM") == "1":
            pytest.fail(f"GEN_PIPELINE_SLURM=1 but {reason}")
        pytest.skip(reason)
    conf = os.environ.get("SLURM_CONF")
    if conf and subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0:
        yield {**env(), "SLURM_CONF": conf}
        return
    cluster = tmp_path_factory.mktemp("slurm") / "cluster"
    try:
        ports = {**os.environ, "SLURM_LOCAL_PORT": str(port_block(5))}  # not a port another test took at random
        started = subprocess.run([SLURM / "local-cluster.sh", "start", cluster], capture_output=True, text=True,
                                 env=ports, timeout=120)  # fmt: skip
        assert started.returncode == 0, started.stderr
        yield {**env(), "SLURM_CONF": str(cluster / "slurm.conf")}
    finally:
        subprocess.run([SLURM / "local-cluster.sh", "stop", cluster], timeout=120)


def port_block(n: int) -> int:
    """The first of `n` consecutive ports that are free now (the array's simulated fleets)."""
    for base in range(47000, 60000, 97):
        with contextlib.ExitStack() as stack:
            try:
                for p in range(base, base + n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return base
    raise AssertionError(f"no {n} consecutive free ports")


def submit(slurm_env: dict[str, str], inp: Path, out: Path, array: str, token_latency: float, *sbatch: str,
           command: str = f"{PY} -m gen_pipeline") -> str:  # fmt: skip
    """run/slurm/submit.sh INPUT OUT --array=... [sbatch options]: FLEET=simulate, 2 servers a task; the array's
    job id."""
    run_env = {**slurm_env, "FLEET": "simulate", "NUM_SERVERS": "2", "BASE_PORT": str(port_block(32)),
               "GEN_PIPELINE": command, "PYTHONPATH": str(ROOT),
               "SIM_ARGS": f"--token-latency {token_latency} --health-delay 0 --tokenizer {TINY}",
               "GEN_ARGS": f"--shards {SHARDS} --concurrency 4 --tokenizer {TINY}", "STARTUP_TIMEOUT": "60",
               "SCRATCH_DIR": str(out.parent)}  # fmt: skip
    done = subprocess.run([SLURM / "submit.sh", inp, out, f"--array={array}", "--parsable", *sbatch],
                          env=run_env, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def wait_array(slurm_env: dict[str, str], job: str) -> dict[str, tuple[str, str]]:
    """Block until no task of `job` is pending or running (a requeued one is pending); each task's (state,
    exit code)."""
    deadline = time.monotonic() + ARRAY_DEADLINE
    while time.monotonic() < deadline:
        left = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], env=slurm_env, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        if left.returncode == 0 and not left.stdout.strip():
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"array {job} still running after {ARRAY_DEADLINE}s")
    return {task: (f["JobState"], f["ExitCode"]) for task, f in job_fields(slurm_env, job).items()}


def job_fields(slurm_env: dict[str, str], job: str) -> dict[str, dict[str, str]]:
    """What `scontrol show job` says of each task of `job`, by task id."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=slurm_env, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
    tasks = {}
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        tasks[fields["ArrayTaskId"]] = fields
    return tasks


def write_input(tmp_path: Path, n: int) -> tuple[Path, list[int]]:
    """`n` chat prompts in tmp_path/in.jsonl."""
    rows = prompts(n)
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return inp, [r["id"] for r in rows]


def assert_whole(out: Path, ids: list[int]) -> None:
    """Every key exactly once across the shard files, nothing ledgered, every shard settled."""
    assert check_invariant(ids, out) == {"done": len(ids), "ledger": 0}
    unsettled = [s for s in range(SHARDS) if not RunDir(out).shard(s).settled.exists()]
    assert not unsettled, f"shards not settled: {unsettled}"


def claimers(out: Path) -> list[dict[str, Any]]:
    """What each claimer last wrote in DIR/claimers/ (one torn by a write in progress is left out)."""
    found = []
    for path in out.glob("claimers/*.json"):
        if not path.name.endswith("-summary.json"):
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                found.append(orjson.loads(path.read_bytes()))
    return found


def claimer_of(out: Path, task: str, timeout: float) -> int:
    """The pid of a running claimer of array task `task`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info in claimers(out):
            if info["claimer"]["slurm"].get("task") == task and info["state"] == "running":
                return int(info["pid"])
        time.sleep(0.05)
    raise AssertionError(f"no running claimer of task {task}")


def test_array_of_four_writes_every_key_once(slurm_env, tmp_path):
    """sbatch of generate.sbatch as a 4-task array: every task exits 0, every key once, every shard settled."""
    inp, ids = write_input(tmp_path, 300)
    out = tmp_path / "out"
    job = submit(slurm_env, inp, out, "0-3", 0.002)
    tasks = wait_array(slurm_env, job)
    logs = "".join(p.read_text() for p in (out / "slurm").glob("*.out"))
    assert tasks == {str(t): ("COMPLETED", "0:0") for t in range(4)}, logs
    assert_whole(out, ids)
    # the tasks shared the shards; one that starts after the others took every shard rightly claims none
    assert len({c["claimer"]["slurm"]["task"] for c in claimers(out)}) >= 2


def test_one_task_with_a_fleet_4x_slower_does_not_hold_the_run(slurm_env, tmp_path):
    """Task 0's simulated fleet is 4x slower than the others': it does a smaller share (the others take the
    open shards), and the run ends soon after the median claimer's last row, not when a static quarter of the
    rows would have ended on the slow node: every key once."""
    inp, ids = write_input(tmp_path, 800)
    out = tmp_path / "out"
    slow = tmp_path / "gen-pipeline-task0-slow"  # the command the tasks run: task 0's simulator 4x slower
    slow.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = simulate ] && [ "$SLURM_ARRAY_TASK_ID" = 0 ]; then exec {PY} -m gen_pipeline "$@" '
        "--token-latency 0.04; fi\n"
        f'exec {PY} -m gen_pipeline "$@"\n'
    )
    slow.chmod(0o755)
    job = submit(slurm_env, inp, out, "0-3", 0.01, command=str(slow))
    tasks = wait_array(slurm_env, job)
    assert tasks == {str(t): ("COMPLETED", "0:0") for t in range(4)}, tasks
    assert_whole(out, ids)
    parts = {}
    for c in claimers(out):
        summary = orjson.loads(RunDir(out).claimer(c["claimer"]["id"]).summary.read_bytes())
        parts[c["claimer"]["slurm"]["task"]] = summary
    assert set(parts) == {"0", "1", "2", "3"}, parts.keys()
    fast = sorted((parts[t] for t in "123"), key=lambda p: p["ended"])
    median = fast[1]
    assert parts["0"]["completed"] < min(p["completed"] for p in fast), {t: p["completed"] for t, p in parts.items()}
    end = max(p["ended"] for p in parts.values())
    busy = median["ended"] - median["started"]
    assert end - median["ended"] <= 1.5 * busy, (end - median["ended"], busy)


def test_killed_claimer_and_cancelled_task_lose_nothing(slurm_env, tmp_path):
    """kill -9 of task 1's generate (its script starts another) and scancel of task 2 mid-run; a resubmission
    of task 2 finishes what is left: every key once, 0 lost, 0 duplicated."""
    inp, ids = write_input(tmp_path, 600)
    out = tmp_path / "out"
    job = submit(slurm_env, inp, out, "0-3", 0.01)
    victim = claimer_of(out, "1", 60)
    claimer_of(out, "2", 60)
    wait_for_done(out, 100, 60)
    os.kill(victim, signal.SIGKILL)
    wait_for_done(out, 200, 60)
    subprocess.run(["scancel", f"{job}_2"], env=slurm_env, check=True, timeout=30)
    tasks = wait_array(slurm_env, job)
    assert tasks["2"][0] == "CANCELLED" and tasks["1"] == ("COMPLETED", "0:0"), tasks
    assert sum(c["claimer"]["slurm"]["task"] == "1" for c in claimers(out)) == 2  # task 1 started generate again
    again = submit(slurm_env, inp, out, "2", 0.002)
    assert wait_array(slurm_env, again) == {"2": ("COMPLETED", "0:0")}
    assert_whole(out, ids)


IN_HAND = 2 * 4 * 2  # rows a task's claimer can have read: 2 servers x --concurrency 4, and as many waiting
SIGNAL_SLACK = 12  # rows it may yet take in the time the signal takes to arrive


def time_limit_near(slurm_env: dict[str, str], out: Path, job: str, task: str,
                    ids: list[int]) -> tuple[dict[str, Any], set[int]]:  # fmt: skip
    """Once task `task` is mid-run and holds a shard it cannot finish from what it has in hand (more of the
    shard's rows unwritten than it can have read, with slack), USR1 to its batch script only, as Slurm does at
    --signal=B:USR1@T; what the task's claimer last said (its status file) once it drained, and every shard it
    was seen holding. (A claimer drained near the end of its shards rightly finishes them from what it has in
    flight and lets go of nothing: the CI failure this guards against.) What it holds is read from the shards'
    lock files, which name their holder at once (its status file names them every 2 s: too late for a claim
    of one shard, done in about that time)."""
    pid = claimer_of(out, task, 60)
    seen: set[int] = set()
    rows = {s: 0 for s in range(SHARDS)}
    for i in ids:
        rows[shard_of(i, None, SHARDS)] += 1

    def held() -> set[int]:
        mine = set()
        for s in range(SHARDS):
            shard = RunDir(out).shard(s)
            with contextlib.suppress(OSError):
                if shard.lock.read_text().startswith(f"pid {pid} ") and not shard.settled.exists():
                    mine.add(s)
        seen.update(mine)
        return mine

    def unwritten(shard: int) -> int:
        path = RunDir(out).shard(shard).writer.completions
        return rows[shard] - (path.read_bytes().count(b"\n") if path.exists() else 0)

    def finished() -> list[dict[str, Any]]:
        return [c for c in claimers(out) if c["claimer"]["slurm"].get("task") == task and c["state"] == "finished"]

    deadline = time.monotonic() + 60
    while not (done_rows(out) >= 50 and any(unwritten(s) >= IN_HAND + SIGNAL_SLACK for s in held())):
        assert time.monotonic() < deadline and not finished(), f"task {task} never held a shard it could not finish"
        time.sleep(0.02)
    subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job}_{task}"], env=slurm_env, check=True, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held()
        if drained := finished():
            return drained[0], seen
        time.sleep(0.05)
    raise AssertionError(f"task {task}'s claimer did not drain")


def done_rows(out: Path) -> int:
    """Completion lines written so far over every shard."""
    return sum(p.read_bytes().count(b"\n") for p in RunDir(out).completion_files())


def assert_drained(out: Path, log: str, claimer: dict[str, Any], seen: set[int]) -> None:
    """The task's generate stopped cleanly on the drain (exit 130, not a crash), and the shards it held then
    were finished by another claimer (its claims were let go): of the shards it was seen holding, those it
    did not settle itself were settled by others, and there were some."""
    assert "USR1 (time limit near): draining" in log and "SIGTERM: stopping" in log, log
    assert "gen-pipeline: generate exited with 130" in log, log
    ident = claimer["claimer"]["id"]
    assert orjson.loads(RunDir(out).claimer(ident).summary.read_bytes())["exit_code"] == 130
    settled_by = {s: orjson.loads(RunDir(out).shard(s).settled.read_bytes())["by"] for s in seen}
    let_go = [s for s, by in settled_by.items() if by != ident]
    assert let_go, f"the drained claimer let go of no shard it held: {settled_by}"


def fleet_ports(scratch: Path, job_id: str) -> list[int]:
    """The ports the simulated fleet of Slurm job `job_id` listened on (its scratch folder's simulate.log)."""
    log = (scratch / f"gen-pipeline-{job_id}" / "simulate.log").read_text()
    return sorted(int(p) for p in re.findall(r"listening on http://127\.0\.0\.1:(\d+)", log))


def exported_ids(out: Path, tmp_path: Path) -> list[str]:
    """`gen-pipeline export OUT` (it refuses open shards and a key found twice): the exported rows' ids."""
    ds = tmp_path / "dataset"
    done = subprocess.run([PY, "-m", "gen_pipeline", "export", out, "--out", ds], env=env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [str(i) for p in sorted(ds.glob("data/*.parquet")) for i in pq.read_table(p, columns=["id"])["id"]]


def test_usr1_drains_and_requeues_the_task(slurm_env, tmp_path):
    """USR1 to task 1's batch script mid-run (the time limit is near): its generate drains, its shards are
    finished by others, `scontrol requeue` puts the task back and it runs again: every key once."""
    inp, ids = write_input(tmp_path, 600)
    out = tmp_path / "out"
    job = submit(slurm_env, inp, out, "0-3", 0.01)
    drained, seen = time_limit_near(slurm_env, out, job, "1", ids)
    tasks = wait_array(slurm_env, job)
    log = (out / "slurm" / f"{job}_1.out").read_text()
    assert tasks == {str(t): ("COMPLETED", "0:0") for t in range(4)}, log
    assert int(job_fields(slurm_env, job)["1"]["Restarts"]) >= 1, log
    assert "gen-pipeline: requeueing" in log and "submitting this script again" not in log, log
    again = log.split("gen-pipeline: requeueing", 1)[1]
    assert "gen-pipeline: generate exited with 0" in again, log  # the requeued task ran the script again
    assert_drained(out, log, drained, seen)
    assert_whole(out, ids)
    assert sorted(exported_ids(out, tmp_path)) == sorted(map(str, ids))


def test_usr1_where_requeue_is_not_allowed_submits_again(slurm_env, tmp_path):
    """With --no-requeue, `scontrol requeue` is refused: the drained task submits generate.sbatch again with
    the user's sbatch options, and that job finishes the run: every key once."""
    inp, ids = write_input(tmp_path, 600)
    out = tmp_path / "out"
    job = submit(slurm_env, inp, out, "0-3", 0.01, "--no-requeue")
    drained, seen = time_limit_near(slurm_env, out, job, "1", ids)
    tasks = wait_array(slurm_env, job)
    log = (out / "slurm" / f"{job}_1.out").read_text()
    again = re.search(r"gen-pipeline: submitted again as job (\d+)", log)
    assert again is not None, log
    assert wait_array(slurm_env, again[1]) == {"1": ("COMPLETED", "0:0")}
    assert job_fields(slurm_env, again[1])["1"]["Requeue"] == "0"  # the user's --no-requeue came along
    first, second = (job_fields(slurm_env, j)["1"]["JobId"] for j in (job, again[1]))
    assert fleet_ports(tmp_path, first) == fleet_ports(tmp_path, second) != []  # its own task's, not task 2's
    assert tasks == {**{str(t): ("COMPLETED", "0:0") for t in (0, 2, 3)}, "1": ("FAILED", "130:0")}, log
    assert "submitting this script again" in log and job_fields(slurm_env, job)["1"]["Restarts"] == "0", log
    assert_drained(out, log, drained, seen)
    assert_whole(out, ids)
    assert sorted(exported_ids(out, tmp_path)) == sorted(map(str, ids))
