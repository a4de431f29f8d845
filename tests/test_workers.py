"""generate --workers K: shards by stable id hash, one merged summary, resumable with any K."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import orjson
import pytest
from e2e import check_invariant, prompts
from procs import generate, run_generate, sim_fleet, wait_for_done

from gen_pipeline.engine.summary import merge_summaries
from gen_pipeline.shards.workers import merged_exit_code
from gen_pipeline.tokens import TINY_TOKENIZER


@pytest.mark.parametrize(
    ("codes", "expected"),
    [([0, 0], 0), ([0, 3], 3), ([130, 3], 130), ([4, 130], 4), ([5, 4], 5), ([1, 5], 1), ([-9, 0], 130)],
)
def test_merged_exit_code(codes, expected):
    """The run exits with its most serious worker's code; a killed worker counts as interrupted."""
    assert merged_exit_code(codes) == expected


def test_merge_summaries_adds_counts():
    """Counts, tallies, drift and per-server figures add up across workers."""
    part = {
        "completed": 2,
        "skipped": {"done": 1},
        "failed": {"timeout": 1},
        "finish_reasons": {"stop": 2},
        "output_tokens": 10,
        "token_drift": {"compared": 2, "differed": 1, "by_offset": {"3": 1}},
        "servers": {"s": {"requests": 3, "completions": 2, "failures": {"timeout": 1}, "capacity": 4}},
        "warnings": ["w"],
    }
    merged = merge_summaries([part, part], elapsed=2.0, exit_code=3)
    assert merged["completed"] == 4 and merged["skipped"] == {"done": 2} and merged["failed"] == {"timeout": 2}
    assert merged["token_drift"] == {"compared": 4, "differed": 2, "by_offset": {"3": 2}}
    assert merged["servers"]["s"]["requests"] == 6 and merged["servers"]["s"]["capacity"] == 8
    assert merged["requests_per_s"] == 2.0 and merged["warnings"] == ["w"] and merged["workers"] == 2


@pytest.mark.slow
def test_workers_split_then_resume_with_any_k(write_jsonl, tmp_path):
    """Two workers split the rows once each; a resume with three and then one worker sends only new rows."""
    rows = prompts(400)
    path, out = write_jsonl([*rows, b"{broken"]), tmp_path / "out"
    with sim_fleet(4, "--token-latency", "0.001") as servers:
        first = run_generate(path, out, servers, "--workers", "2")
        assert first.returncode == 0, first.stderr
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["completed"] == 400 and summary["failed"] == {"bad_input": 1} and summary["workers"] == 2
        assert not list(out.glob("completions*.jsonl"))  # the workers are claimers: shards/SSSSS/ files
        parts = [orjson.loads(p.read_bytes()) for p in out.glob("claimers/*-summary.json")]
        assert len(parts) == 2 and all(p["completed"] > 50 for p in parts)  # both did real work
        # the layout of an earlier version: static worker files at the top, no shards in the manifest
        lines = [line for p in sorted(out.glob("shards/*/completions.jsonl")) for line in p.read_bytes().splitlines()]
        for i in (0, 1):
            (out / f"completions-{i:05d}.jsonl").write_bytes(b"".join(x + b"\n" for x in lines[i::2]))
        failed = b"".join(p.read_bytes() for p in out.glob("shards/*/failures.jsonl"))
        (out / "failures-00000.jsonl").write_bytes(failed)
        shutil.rmtree(out / "shards")
        manifest = orjson.loads((out / "manifest.json").read_bytes())
        del manifest["shards"]
        (out / "manifest.json").write_bytes(orjson.dumps(manifest))
        more = prompts(60, start=400)
        path = write_jsonl([*rows, b"{broken", *more])
        second = run_generate(path, out, servers, "--workers", "3")
        assert second.returncode == 0, second.stderr
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["completed"] == 60 and summary["skipped"] == {"done": 400, "bad_input": 1}
        third = run_generate(path, out, servers)
        assert third.returncode == 0 and "completed 0 " in third.stdout
    assert check_invariant([r["id"] for r in rows + more], out) == {
        "done": 460,
        "ledger": 0,
    }  # the broken row has no id


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_then_resume_completes(write_jsonl, tmp_path):
    """SIGINT to the parent stops all workers (exit 130); the rerun finishes with one line per id."""
    rows = prompts(600)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.005") as servers:
        proc = generate(path, out, servers, "--workers", "2", "--concurrency", "4")
        wait_for_done(out, 20, 60)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        assert "to resume, run the same command again" in stdout
        again = run_generate(path, out, servers, "--workers", "2")
    assert again.returncode == 0, again.stderr
    assert check_invariant([r["id"] for r in rows], out) == {"done": 600, "ledger": 0}


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_a_claimer_killed_from_outside_is_no_interrupt_when_the_others_finish_its_shards(write_jsonl, tmp_path):
    """kill -9 of one claimer (the OOM killer, say), not of the run: its claims die with it, the other claimer
    takes its shards over and every row is done once, so the run exits 0 (it exited 130, "interrupted"),
    with a warning that the dead claimer left no summary."""
    rows = prompts(1200)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.005") as servers:
        proc = generate(path, out, servers, "--workers", "2", "--shards", "16", "--concurrency", "4")
        wait_for_done(out, 50, 60)
        [victim, *_] = children(proc.pid)
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["exit_code"] == 0 and any("no summary from worker" in w for w in summary["warnings"])
    assert check_invariant([r["id"] for r in rows], out) == {"done": 1200, "ledger": 0}


@pytest.mark.slow  # an end-to-end run of several seconds; make test-fast leaves it out
def test_a_vocabulary_the_workers_cannot_load_is_reported(write_jsonl, tmp_path):
    """The parent reads only the chat template; a broken tokenizer.json stops every worker, each with its
    error, and the merged summary says which workers left none (exit 1, nothing written)."""
    folder = tmp_path / "tok"
    shutil.copytree(TINY_TOKENIZER, folder)
    (folder / "tokenizer.json").write_text("{not json")
    path, out = write_jsonl(prompts(20)), tmp_path / "out"
    with sim_fleet(2) as servers:
        done = run_generate(path, out, servers, "--workers", "2", "--tokenizer", str(folder))
    assert done.returncode == 1
    assert done.stderr.count(f"cannot load tokenizer '{folder}'") == 2
    assert "no summary from worker 0 (exit 1), worker 1 (exit 1)" in done.stdout
    assert not any(p.stat().st_size for p in out.glob("completions*.jsonl"))
