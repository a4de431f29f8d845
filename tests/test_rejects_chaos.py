"""Rejected answers under kill -9: every key once (an answer that passed, or ledgered), every reject kept once,
attempts counted across the resumes, never past the bound."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import prompts
from procs import env, generate, generate_argv, run_generate, sim_fleet

from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.samples import answer_seed

pytestmark = pytest.mark.slow

SEED = 5
BOUND = 2  # the default --max-resamples


def whole_lines(paths: list[Path]) -> list[dict[str, Any]]:
    """The whole lines of these files (a kill -9 may leave one torn at the end until the next run repairs it);
    each must be valid JSON."""
    found = []
    for path in paths:
        data = path.read_bytes()
        found += [orjson.loads(raw) for raw in data[: data.rfind(b"\n") + 1].splitlines()]
    return found


def campaign(path: Path, out: Path, servers: str, args: tuple[str, ...], kills_wanted: int, rows: int) -> int:
    rng, kills = random.Random(17), 0
    while kills < kills_wanted:
        before = len(whole_lines(RunDir(out).completion_files()))
        if before >= rows - 20:
            break
        proc = generate(path, out, servers, *args)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(whole_lines(RunDir(out).completion_files())) < before + 15:
            time.sleep(0.05)
        time.sleep(rng.random() * 0.3)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        kills += 1
    return kills


def assert_every_key_once_every_reject_kept(out: Path, rows: list[dict[str, Any]]) -> tuple[int, int, int]:
    """The run's promise with rejects: each id once, in the output (valid JSON, after as many rejects as its line
    says) or ledgered invalid (after 1 + BOUND of them); each reject once, attempts 0, 1, ... per key, each sent
    with its attempt's seed, never past the bound; no file ends torn (the last run repaired any)."""
    run = RunDir(out)
    for p in [*run.completion_files(), *run.failure_files(), *run.rejected_files()]:
        assert p.read_bytes().endswith(b"\n") or not p.stat().st_size, p
    done, failed = whole_lines(run.completion_files()), whole_lines(run.failure_files())
    kept = whole_lines(run.rejected_files())
    ids = Counter(r["id"] for r in done)
    assert not [i for i, n in ids.items() if n > 1], "an answer was written twice"
    ledgered = {f["id"]: f for f in failed}
    assert set(ids) | set(ledgered) == {r["id"] for r in rows} and not set(ids) & set(ledgered)
    attempts: dict[Any, list[int]] = defaultdict(list)
    for r in kept:
        assert r["check"] == "json" and r["seed"] == answer_seed(SEED, r["id"], 0, 0, r["attempt"])
        attempts[r["id"]].append(r["attempt"])
    for rid, made in attempts.items():
        assert sorted(made) == list(range(len(made))), (rid, made)  # each reject once, none lost
        assert len(made) <= 1 + BOUND, (rid, made)  # never past the bound
    for r in done:
        orjson.loads(r["completion"])
        assert r.get("rejected", 0) == len(attempts.get(r["id"], [])), r["id"]
    for rid, f in ledgered.items():
        assert f["reason"] == "invalid" and len(attempts[rid]) == 1 + BOUND, rid
    return len(done), len(ledgered), len(kept)


@pytest.mark.parametrize("workers", [1, 2])
def test_kill_9_campaign_with_rejected_answers(write_jsonl, tmp_path, workers):
    """SIGKILLs at random moments of runs with --validate json on a fleet that wraps a third of its answers in
    prose, each followed by a resume (--workers 2: claimers, each keeping its shards' rejects)."""
    rows = prompts(500)
    path, out = write_jsonl(rows), tmp_path / "out"
    args = ("--validate", "json", "--seed", str(SEED), "--concurrency", "8", "--grace-period", "1")
    args += ("--workers", str(workers))
    sim = ("--token-latency", "0.003", "--seed", "3", "--json-answers", "--invalid", "prose:0.35")
    with sim_fleet(3, *sim) as servers:
        kills = campaign(path, out, servers, args, 6, len(rows))
        final = run_generate(path, out, servers, *args)
    assert final.returncode == 0, final.stderr
    assert kills >= 3
    done, ledgered, kept = assert_every_key_once_every_reject_kept(out, rows)
    assert kept >= 100 and done + ledgered == 500
    if workers > 1:  # each claimer keeps its shards' rejects in their folders
        files = RunDir(out).rejected_files()
        assert files and all(p.parent.parent.name == "shards" for p in files)
    print(f"\nrejects kill -9 campaign (--workers {workers}): kills={kills} rows=500 written={done} "
          f"ledgered={ledgered} rejects kept={kept} duplicates=0 lost=0")  # fmt: skip


def test_a_failing_validator_stops_a_claimer_run_with_exit_1(write_jsonl, tmp_path):
    """--workers 2 and a --validate python: function that raises on one row: the run stops with exit 1 and says
    why, as a single process does (the claimer that raised hung for good before: its feed waited for rows to be
    wanted by workers that were gone, and the Runner's tokenizer pool waited for the feed)."""
    checks = tmp_path / "checks.py"  # raises on each claimer's 10th answer, while rows of its claim still wait
    checks.write_text("calls = 0\n\ndef crash(answer):\n    global calls\n    calls += 1\n    if calls >= 10:\n"
                      "        raise ValueError('boom')\n")  # fmt: skip
    path, out = write_jsonl(prompts(200)), tmp_path / "out"
    args = ("--workers", "2", "--concurrency", "4", "--validate", f"python:{checks}:crash", "--grace-period", "1")
    with sim_fleet(4, "--token-latency", "0.01", "--max-running", "4") as servers:
        proc = subprocess.Popen(
            generate_argv(path, out, servers, *args, progress="off"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env(),
            text=True,
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("generate --workers 2 hung after its --validate function raised")
    assert proc.returncode == 1, err
    assert "--validate python:" in err and "raised ValueError: boom" in err
