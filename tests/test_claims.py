"""Claimed shards: any number of claimers over one run directory, each row written once (claims.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import orjson
import pytest
from e2e import check_invariant, prompts, read_jsonl, run_sim
from procs import generate, run_generate, sim_fleet

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.inputs.kinds import input_fingerprint
from gen_pipeline.modes import run_async
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.shards.claims import ShardTable, batch_size, shard_of
from gen_pipeline.sim import SimConfig, free_ports, start_fleet


def test_batch_size_halves_toward_one():
    """A claim takes half an even split of the free shards over the live claimers, at most V/16, at least one."""
    assert batch_size(256, 4, 256) == 16  # capped at V/16
    assert batch_size(40, 4, 256) == 5
    assert batch_size(3, 4, 256) == 1
    assert batch_size(0, 1, 4) == 1


def test_free_shards_are_open_and_held_by_nobody(tmp_path):
    """A claim is sized from the free shards: open ones another claimer holds are not free (counting them
    made a 4x slow node take twice its share at the end: bench/claimers.py)."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"{}\n")
    table = ShardTable(RunDir(tmp_path), 8, input_fingerprint(inp))
    held = [table.try_claim(s) for s in (1, 2, 3)]
    table.mark_settled(3, "me")
    held.pop().release()
    assert table.free_shards() == [0, 4, 5, 6, 7]
    assert table.free_shards(skip=[0, 5]) == [4, 6, 7]
    taken = table.claim(5, table.free_shards())
    assert set(taken) == {0, 4, 5, 6, 7} and table.free_shards() == []
    for claim in [*held, *taken.values()]:
        claim.release()
    assert table.free_shards() == [0, 1, 2, 4, 5, 6, 7]


def test_a_claim_is_exclusive_and_dies_with_its_holder(tmp_path):
    """A second claim of a held shard fails; a settled shard is never claimed; a grown input reopens it."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"{}\n")
    table = ShardTable(RunDir(tmp_path), 4, input_fingerprint(inp))
    first = table.try_claim(1)
    assert first is not None and table.try_claim(1) is None
    child = subprocess.run(
        ["python3", "-c", f"import fcntl,os; fd=os.open({str(first.shard.lock)!r}, os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB)"], capture_output=True)  # fmt: skip
    assert child.returncode != 0  # another process is refused too
    table.mark_settled(1, "me")
    first.release()
    assert table.try_claim(1) is None and 1 not in table.open_shards()
    inp.write_bytes(b"{}\n{}\n")
    assert 1 in ShardTable(RunDir(tmp_path), 4, input_fingerprint(inp)).open_shards()


async def _idle_while_claiming(path, out) -> tuple[list[float], int]:
    """One claimer over 8 shards (a claim of one shard at a time) on one simulated port, its in-flight
    requests sampled every millisecond: the moments nothing was in flight between its first request and
    its last reply, and the rows it completed."""
    sim = SimConfig(ports=(free_ports(1)[0],), health_delay=0.0, max_running=4, token_latency=0.004,
                    completion_words=100_000)  # fmt: skip
    async with await start_fleet(sim) as fleet:
        stats = next(iter(fleet.stats.values()))
        idle: list[float] = []
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                if stats.in_flight == 0 and stats.first_request_at is not None:
                    idle.append(time.time())
                await asyncio.sleep(0.001)

        sampler = asyncio.create_task(sample())
        config = RunConfig(input=path, out=out, servers=tuple(fleet.urls), retry=RetryPolicy.testing(),
                           progress="off", max_tokens=20, shards=8)  # fmt: skip
        try:
            outcome = await run_async(config, handle_signals=False)
        finally:
            done.set()
            await sampler
        last = stats.last_reply_at or 0.0
        return [t for t in idle if t < last], int(outcome.summary["completed"])


def test_the_fleet_never_drains_between_claims(write_jsonl, tmp_path):
    """The next claim's rows are sent while the last claim's requests are in flight: between the first
    request and the last reply, the server always has one (each claim of its own Runner drained it)."""
    rows = prompts(160)
    path, out = write_jsonl(rows), tmp_path / "out"
    idle, completed = asyncio.run(asyncio.wait_for(_idle_while_claiming(path, out), 60))
    assert completed == 160
    assert all(RunDir(out).shard(s).settled.exists() for s in range(8))
    assert idle == []
    assert check_invariant([r["id"] for r in rows], out) == {"done": 160, "ledger": 0}


@pytest.mark.slow
def test_claimed_run_then_resume(write_jsonl, tmp_path):
    """--shards 8: every row lands in its own shard's file once; every shard settles; a rerun sends nothing."""
    rows = prompts(300)
    path, out = write_jsonl([*rows, b"{broken"]), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.001") as servers:
        first = run_generate(path, out, servers, "--shards", "8")
        assert first.returncode == 0, first.stderr
        manifest = orjson.loads((out / "manifest.json").read_bytes())
        assert manifest["shards"] == 8
        rundir = RunDir(out)
        for s in range(8):
            shard = rundir.shard(s)
            assert shard.settled.exists()
            assert all(shard_of(r["id"], None, 8) == s for r in read_jsonl(shard.writer.completions))
        assert not (out / "completions.jsonl").exists()
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["completed"] == 300 and summary["failed"] == {"bad_input": 1}
        again = run_generate(path, out, servers, "--join", "--shards", "9")
        assert again.returncode == 1 and "--shards 8" in again.stderr
        again = run_generate(path, out, servers)  # the manifest makes it a claimer: all settled, nothing to do
        assert again.returncode == 0, again.stderr
        assert "completed 0 " in again.stdout
    assert check_invariant([r["id"] for r in rows], out) == {"done": 300, "ledger": 0}


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]])
def test_a_torn_line_in_a_settled_shard_reopens_it(write_jsonl, tmp_path, workers):
    """A settled shard whose output or ledger ends in a torn line (the disk lost what a crash was writing, a
    copy cut short) is settled no more: the line is moved aside and its row sent or ledgered again. The
    marker was trusted: the row ended in neither file, every rerun said "completed 0" and exited 0."""
    rows = prompts(200)
    path, out = write_jsonl([*rows, b"{broken"]), tmp_path / "out"  # line 201: shard 201 % 4 = 1
    with sim_fleet(2, "--token-latency", "0.001") as servers:
        first = run_generate(path, out, servers, "--shards", "4", *workers)
        assert first.returncode == 0, first.stderr
        rundir = RunDir(out)
        for index, file, cut in ((0, "completions", 40), (1, "failures", 10)):
            assert rundir.shard(index).settled.exists()
            with getattr(rundir.shard(index).writer, file).open("rb+") as f:
                f.truncate(f.seek(0, 2) - cut)
        again = run_generate(path, out, servers, *workers)
        assert again.returncode == 0, again.stderr
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["completed"] == 1 and summary["failed"] == {"bad_input": 1}, summary
        assert all(rundir.shard(s).settled.exists() for s in range(4))
        ledgered = [e for f in rundir.failure_files() for e in read_jsonl(f)]
        assert [(e["line"], e["reason"]) for e in ledgered] == [(201, "bad_input")]  # once, not twice
    assert check_invariant([r["id"] for r in rows], out) == {"done": 200, "ledger": 0}


@pytest.mark.slow
def test_second_generate_refused_unless_join(write_jsonl, tmp_path):
    """While one claimer runs, a plain generate is refused and a --join one claims beside it; kill -9 of
    the first leaves its shards open, and a later claimer finishes them: every id once."""
    rows = prompts(800)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.004") as servers:
        first = generate(path, out, servers, "--shards", "32", "--concurrency", "4")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(out.glob("shards/*/completions.jsonl")):
            time.sleep(0.05)
        refused = run_generate(path, out, servers)
        assert refused.returncode == 1 and "--join" in refused.stderr
        joiner = generate(path, out, servers, "--join", "--concurrency", "4")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(RunDir(out).claimers()) < 2:
            time.sleep(0.05)  # until the joiner has claimed shards and runs (its status file)
        assert len(RunDir(out).claimers()) == 2
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
        _, err = joiner.communicate(timeout=120)
        assert joiner.returncode == 0, err
        last = run_generate(path, out, servers, "--join")
        assert last.returncode == 0, last.stderr
    assert check_invariant([r["id"] for r in rows], out)["done"] == 800
    assert all(RunDir(out).shard(s).settled.exists() for s in range(32))


def test_a_transient_failure_keeps_only_its_shard_open(write_jsonl, tmp_path):
    """Rows ledgered as server_error leave their shards open (exit 3) while the others settle; a rerun
    sends just those rows and settles every shard."""
    from test_pipeline import _policy

    rows = prompts(120)
    path, out = write_jsonl(rows), tmp_path / "out"
    # the fault stream is seeded by seed + port (ports are free ones): at 5% a run saw no failure at all once
    flaky, _ = run_sim(path, out, {"n_ports": 2, "p500": 0.15, "seed": 3}, retry=_policy(1), shards=32)
    failed = {shard_of(r["id"], None, 32) for p in RunDir(out).failure_files() for r in read_jsonl(p)}
    assert flaky.exit_code == 3 and 0 < len(failed) < 32, failed
    assert {s for s in range(32) if not RunDir(out).shard(s).settled.exists()} == failed
    again, _ = run_sim(path, out, {"n_ports": 2}, shards=32)
    assert again.exit_code == 0 and again.summary["completed"] == flaky.summary["failed"]["server_error"]
    assert all(RunDir(out).shard(s).settled.exists() for s in range(32))
    check_invariant([r["id"] for r in rows], out)


def test_a_line_over_the_size_limit_is_ledgered_once_by_its_own_shard(write_jsonl, tmp_path, monkeypatch):
    """A line too long to read an id from falls in the shard of its line number, like any row without an
    id: a claimer holding other shards passes it by (it crashed on it, having no files for its shard), and
    the one holding its shard ledgers it once."""
    from gen_pipeline.inputs import source

    monkeypatch.setattr(source, "MAX_LINE_BYTES", 1000)
    rows = prompts(60)
    huge = orjson.dumps({"id": "big", "prompt": "x" * 5000})
    path, out = write_jsonl([*rows[:30], huge, *rows[30:]]), tmp_path / "out"
    outcome, _ = run_sim(path, out, {"n_ports": 2}, shards=8)
    assert outcome.summary["completed"] == 60 and outcome.summary["failed"] == {"bad_input": 1}
    ledger = [(s, f) for s in range(8) for f in read_jsonl(RunDir(out).shard(s).writer.failures)]
    assert [(s, f["line"], f["reason"]) for s, f in ledger] == [(shard_of(None, 31, 8), 31, "bad_input")]
    assert all(RunDir(out).shard(s).settled.exists() for s in range(8))
    assert check_invariant([r["id"] for r in rows], out) == {"done": 60, "ledger": 0}


def test_a_row_reusing_another_rows_id_is_ledgered_once_in_that_ids_shard(write_jsonl, tmp_path):
    """A row repeating an id with other content is ledgered under no id (it must not stand for that id), in
    the shard the id placed it in: the claimer holding that shard read it (a claimer crashed with KeyError
    looking for its line number's shard, which it did not hold), and a rerun ledgers it no second time."""
    rows = prompts(60)
    conflicts = [{"id": r["id"], "prompt": f"other {r['id']}"} for r in rows[:40:10]]
    path, out = write_jsonl([*rows, *conflicts]), tmp_path / "out"
    outcome, _ = run_sim(path, out, {"n_ports": 2}, shards=8)
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {"bad_input": 4}
    ledger = [(s, f) for s in range(8) for f in read_jsonl(RunDir(out).shard(s).writer.failures)]
    placed = sorted((shard_of(c["id"], None, 8), 61 + i) for i, c in enumerate(conflicts))
    assert sorted((s, f["line"]) for s, f in ledger) == placed
    assert all(f["id"] is None and "different content" in f["detail"] for _, f in ledger)
    with path.open("ab") as f:
        f.write(orjson.dumps({"id": "new", "prompt": "a new row"}) + b"\n")
    again, _ = run_sim(path, out, {"n_ports": 2}, shards=8)
    assert again.exit_code == 0
    assert sum(len(read_jsonl(RunDir(out).shard(s).writer.failures)) for s in range(8)) == 4
    assert check_invariant([*(r["id"] for r in rows), "new"], out) == {"done": 61, "ledger": 0}


def test_a_look_at_a_free_shard_does_not_turn_a_claimer_away(tmp_path):
    """`status` or another claimer looking whether a shard is held takes its lock shared for an instant: a
    claim in that instant waits it out (it passed the shard by, and a last shard could be left open with no
    claimer), while a shard a claimer holds is still refused at once."""
    import fcntl
    import os
    import threading

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"{}\n")
    table = ShardTable(RunDir(tmp_path), 4, input_fingerprint(inp))
    table.try_claim(2).release()  # the shard's folder and lock file exist, nobody holds it
    look = os.open(RunDir(tmp_path).shard(2).lock, os.O_RDONLY)
    fcntl.flock(look, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a look in progress, ended 50 ms from now
    threading.Timer(0.05, os.close, (look,)).start()
    claim = table.try_claim(2)
    assert claim is not None
    began = time.monotonic()
    assert table.try_claim(2) is None and time.monotonic() - began < 0.05  # held: refused without waiting
    claim.release()
