"""status, summary.json and export over a claimed-shard run directory built by hand (claims.py's layout)."""

from __future__ import annotations

import time

import orjson
import pytest

from gen_pipeline.errors import ExportCheckError
from gen_pipeline.export.export import check_settled
from gen_pipeline.export.exportconfig import ExportConfig, ExportStats
from gen_pipeline.export.lines import kept_completions
from gen_pipeline.inputs.kinds import input_fingerprint
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.rundir.locks import FileLock
from gen_pipeline.shards.run import aggregate_summary
from gen_pipeline.views.status import inspect_run


def line(i: int) -> bytes:
    return orjson.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": "hi"}], "completion": "ok"}) + b"\n"


@pytest.fixture
def run(tmp_path):
    """A 2-shard run: shard 0 settled with rows r0 r1, shard 1 open with r2."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": f"r{i}", "prompt": "hi"}) + b"\n" for i in range(4)))
    out = tmp_path / "out"
    rundir = RunDir(out)
    for s, rows in ((0, [0, 1]), (1, [2])):
        rundir.shard(s).root.mkdir(parents=True)
        rundir.shard(s).writer.completions.write_bytes(b"".join(line(i) for i in rows))
    rundir.shard(0).settled.write_bytes(orjson.dumps({"input": {**input_fingerprint(source), "samples": 1}}))
    (out / "manifest.json").write_bytes(orjson.dumps({"model": "m", "input": str(source), "shards": 2}))
    return out


def claimer_status(rundir: RunDir, ident: str, updated: float, shards: list[int], done: int) -> None:
    files = rundir.claimer(ident)
    files.status.parent.mkdir(parents=True, exist_ok=True)
    info = {"id": ident, "host": ident, "slurm": {"job": "77", "task": ident[-1]}, "shards": shards,
            "started": updated - 5, "done_total": done}  # fmt: skip
    doc = {"updated": updated, "pid": 1, "state": "running", "counts": {"done": 0}, "rates": {"req_per_s": 2.0},
           "eta_s": 1.0, "servers": {}, "claimer": info}  # fmt: skip
    files.status.write_bytes(orjson.dumps(doc))
    files.lock.touch()


def test_status_shows_each_claimer_flags_the_dead_and_the_stalled(run):
    rundir, now = RunDir(run), time.time()
    claimer_status(rundir, "a-1", now - 1, [1], 2)  # alive, fresh
    claimer_status(rundir, "b-2", now - 2, [], 1)  # its lock is free: dead
    claimer_status(rundir, "c-3", now - 60, [], 0)  # alive but silent for a minute
    locks = [FileLock(rundir.claimer(i).lock) for i in ("a-1", "c-3")]
    for lock in locks:
        lock.acquire()
    try:
        text, code = inspect_run(run, now)
    finally:
        for lock in locks:
            lock.release()
    lines = text.splitlines()
    assert code == 0, text
    assert lines[1].startswith("running (2 of 3 claimers running)"), text
    assert lines[2] == "shards: 2 | open 0 | claimed 1 | settled 1", text
    assert lines[3] == "rows done 3, 1 to go", text
    assert "done 3 |" in lines[4] and "ETA 0 s" in text, text  # 1 row at the two live claimers' 4 rows/s
    a, b, c = (next(x for x in lines if x.startswith(f"  {i}")) for i in ("a-1", "b-2", "c-3"))
    assert "slurm job 77 task 1" in a and "shards 1," in a and "2.0 rows/s" in a and "NOT" not in a, a
    assert "NOT RUNNING" in b, b
    assert "STALLED" in c, c


def test_summary_elapsed_is_the_sessions_wall_time(run):
    rundir = RunDir(run)
    rundir.claimer("x").summary.parent.mkdir(parents=True)
    base = {"completed": 1, "output_tokens": 10, "elapsed_s": 0.0}
    for ident, started, ended in (("old", 10.0, 20.0), ("x", 100.0, 160.0), ("y", 110.0, 150.0)):
        rundir.claimer(ident).summary.write_bytes(orjson.dumps({**base, "started": started, "ended": ended}))
        rundir.claimer(ident).status.write_bytes(b"{}")  # a claimer is listed by its status file
    summary = aggregate_summary(rundir, 0)
    assert summary["elapsed_s"] == 60.0  # 100 to 160: not the sum (100), and not since the old session
    assert summary["completed"] == 2 and summary["claimers"] == 2


def test_a_claimer_stopped_on_the_way_is_not_the_stop_of_a_run_that_ended_well(run):
    """A Slurm task cancelled mid-run (exit 130, "interrupted by SIGTERM") beside one that finished the run
    (exit 0): summary.json and status say exit code 0 without "(interrupted by SIGTERM)", and the early
    stop is a warning."""
    rundir = RunDir(run)
    rundir.claimer("x").summary.parent.mkdir(parents=True)
    base = {"completed": 1, "output_tokens": 10, "elapsed_s": 0.0, "started": 100.0, "ended": 150.0}
    parts = {"x": {"exit_code": 130, "stop_reason": "interrupted by SIGTERM"}, "y": {"exit_code": 0}}
    for ident, part in parts.items():
        rundir.claimer(ident).summary.write_bytes(orjson.dumps({**base, **part}))
        rundir.claimer(ident).status.write_bytes(b"{}")
    summary = aggregate_summary(rundir, 0)
    assert summary["exit_code"] == 0 and summary["stop_reason"] is None
    assert "a claimer stopped early (interrupted by SIGTERM); the others went on" in summary["warnings"]
    (run / "summary.json").write_bytes(orjson.dumps(summary))
    text, _ = inspect_run(run)
    assert "exit code 0" in text and "interrupted" not in text.splitlines()[1], text


def test_export_refuses_open_shards_unless_partial(run, tmp_path):
    config = ExportConfig(runs=(run,), out=tmp_path / "ds")
    with pytest.raises(ExportCheckError, match="1 of 2 shards are not settled"):
        check_settled(config)
    check_settled(ExportConfig(runs=(run,), out=tmp_path / "ds", partial=True))
    stats = ExportStats()
    assert [r["id"] for r in kept_completions(config, stats)] == ["r0", "r1", "r2"] and not stats.twice


def test_export_names_a_key_in_two_shard_files(run, tmp_path):
    with RunDir(run).shard(1).writer.completions.open("ab") as f:
        f.write(line(0))
    stats = ExportStats()
    list(kept_completions(ExportConfig(runs=(run,), out=tmp_path / "ds", partial=True), stats))
    assert len(stats.twice) == 1 and "id 'r0' sample 0" in stats.twice[0], stats.twice
