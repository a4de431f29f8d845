"""--turns all under kill -9: every (id, sample, turn) exactly once, each turn asked with the history written."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import conversation_rows
from procs import generate, run_generate, sim_fleet

from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.send.turns import answer_turn, split_turns

pytestmark = pytest.mark.slow


def lines(out: Path) -> list[dict[str, Any]]:
    """Every completion line of the run (all shard files), each line valid JSON. A file may end in a line being
    written, or torn by the last kill -9 until the next run repairs it: only whole lines count."""
    found = []
    for path in RunDir(out).completion_files():
        data = path.read_bytes()
        found += [orjson.loads(raw) for raw in data[: data.rfind(b"\n") + 1].splitlines()]
    return found


def wait_for(out: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(lines(out)) < n:
        time.sleep(0.05)


def assert_exactly_once(out: Path, rows: list[dict[str, Any]], samples: int) -> int:
    """Every turn of every conversation once, and each asked with the answers written before it; no file
    ends in a torn line (the last run repaired any)."""
    for path in RunDir(out).completion_files():
        assert path.read_bytes().endswith(b"\n") or not path.stat().st_size, path
    found = lines(out)
    places = Counter((r["id"], r["sample"], r["turn"]) for r in found)
    twice = [p for p, n in places.items() if n > 1]
    assert not twice, f"written twice: {twice[:5]}"
    segments = {r["id"]: split_turns(r["messages"]) for r in rows}
    expected = {(i, s, t) for i, seg in segments.items() for s in range(samples) for t in range(len(seg))}
    assert set(places) == expected
    by = {(r["id"], r["sample"], r["turn"]): r for r in found}
    for (rid, s, t), r in by.items():
        before = by.get((rid, s, t - 1))
        history = (
            []
            if before is None
            else [*before["messages"], answer_turn(before["completion"], before.get("reasoning_content"))]
        )
        assert r["messages"] == [*history, *segments[rid][t]], (rid, s, t)
    return len(found)


def campaign(path: Path, out: Path, servers: str, args: tuple[str, ...], kills_wanted: int, total: int) -> int:
    rng, kills = random.Random(7), 0
    while kills < kills_wanted and len(lines(out)) < total - 20:
        before = len(lines(out))
        proc = generate(path, out, servers, *args)
        wait_for(out, before + 15, 60)
        time.sleep(rng.random() * 0.3)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        kills += 1
    return kills


# --concurrency 4 keeps no queue margin; a fleet that reports its running slots gets one (kept room for next
# turns could fill it and hang the tail: the third case)
FLEETS = {"concurrency": ((), ("--concurrency", "4")), "margin": (("--max-running", "4", "--report-max-running"), ())}


@pytest.mark.parametrize(("workers", "fleet"), [(1, "concurrency"), (2, "concurrency"), (1, "margin")])
def test_kill_9_campaign_over_whole_conversations(write_jsonl, tmp_path, workers, fleet):
    rows = conversation_rows(150, turns=2)  # 2 or 3 user turns each
    path, out = write_jsonl(rows), tmp_path / "out"
    total = sum(len(split_turns(r["messages"])) for r in rows) * 2
    sim_args, run_args = FLEETS[fleet]
    args = ("--turns", "all", "--samples", "2", *run_args, "--grace-period", "1", "--workers", str(workers))
    with sim_fleet(3, "--token-latency", "0.004", "--seed", "3", *sim_args) as servers:
        kills = campaign(path, out, servers, args, 6, total)
        final = run_generate(path, out, servers, *args)
    assert final.returncode == 0, final.stderr
    assert kills >= 3
    assert assert_exactly_once(out, rows, 2) == total
    if workers > 1:
        assert all(RunDir(out).shard(s).settled.exists() for s in range(256) if RunDir(out).shard(s).root.exists())
    print(f"\n--turns all kill -9 campaign (--workers {workers}): kills={kills} lines={total} duplicates=0")
