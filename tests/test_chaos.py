"""Data integrity under fire: kill -9 campaigns, signals with faults, a full disk, two writers.

The promise: every input id ends in completions.jsonl exactly once (or in the ledger), nothing is
ever written twice, and every line is valid JSON, whatever happens to the process or the disk.
"""

from __future__ import annotations

import random
import resource
import signal
import time

import orjson
import pytest
from e2e import check_invariant, prompts, read_jsonl, run_sim
from procs import generate, run_generate, sim_fleet, wait_for_lines

pytestmark = pytest.mark.slow


def _all_lines_valid(out) -> int:
    n = 0
    for name in ("completions.jsonl", "failures.jsonl"):
        path = out / name
        if path.exists():
            for line in path.read_bytes().splitlines():
                orjson.loads(line)  # raises on a corrupt line
                n += 1
    return n


def _campaign(path, out, servers, rng, signals, kills_wanted, rows):
    kills = 0
    while kills < kills_wanted:
        before = len(read_jsonl(out / "completions.jsonl"))
        if before >= rows:
            break
        proc = generate(path, out, servers, "--concurrency", "8", "--grace-period", "1")
        wait_for_lines(out / "completions.jsonl", before + 10, 60)
        time.sleep(rng.random() * 0.4)
        proc.send_signal(rng.choice(signals))
        proc.communicate(timeout=60)
        assert proc.returncode in (-9, 130, 0, 3), proc.returncode
        kills += 1
        _all_lines_valid(out)
    return kills


def test_kill_9_campaign(write_jsonl, tmp_path):
    """Ten SIGKILLs at random moments, each followed by a resume: exactly one line per id."""
    rows = prompts(1200)
    path, out = write_jsonl(rows), tmp_path / "out"
    rng = random.Random(11)
    with sim_fleet(4, "--token-latency", "0.003", "--seed", "2") as servers:
        kills = _campaign(path, out, servers, rng, [signal.SIGKILL], 10, len(rows))
        final = run_generate(path, out, servers)
    assert final.returncode == 0, final.stderr
    assert kills >= 10
    assert check_invariant([r["id"] for r in rows], out) == {"done": 1200, "ledger": 0}
    print(f"\nkill -9 campaign: kills={kills} resumes={kills + 1} rows={len(rows)} duplicates=0 lost=0")


def test_term_and_int_campaign_with_faults(write_jsonl, tmp_path):
    """SIGTERM and SIGINT at random moments on a faulty fleet, then resume: nothing lost or doubled."""
    rows = prompts(800)
    path, out = write_jsonl(rows), tmp_path / "out"
    rng = random.Random(5)
    faults = ("--token-latency", "0.003", "--p500", "0.05", "--p-drop", "0.05", "--seed", "4")
    with sim_fleet(4, *faults) as servers:
        kills = _campaign(path, out, servers, rng, [signal.SIGTERM, signal.SIGINT], 6, len(rows))
        final = run_generate(path, out, servers)
    assert final.returncode in (0, 3), final.stderr
    counts = check_invariant([r["id"] for r in rows], out)
    assert counts["done"] + counts["ledger"] >= 800 and kills >= 1
    print(f"\nsignal campaign: signals={kills} rows={len(rows)} {counts}")


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_stops_cleanly_then_resumes(write_jsonl, tmp_path):
    """A write that fails (file-size limit) stops the run with exit 5 naming the file; resume completes."""
    rows = prompts(300)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2) as servers:
        limited = run_generate(path, out, servers, timeout=120, preexec_fn=_limit_file_size(40_000))
        assert limited.returncode == 5, limited.stderr
        assert "completions.jsonl" in limited.stdout + limited.stderr
        whole = (out / "completions.jsonl").read_bytes().count(b"\n")  # a torn tail may follow
        assert 0 < whole < 300
        again = run_generate(path, out, servers, timeout=120)
    assert again.returncode == 0, again.stderr
    _all_lines_valid(out)
    assert check_invariant([r["id"] for r in rows], out) == {"done": 300, "ledger": 0}


def test_second_writer_refused_and_stale_lock_taken_over(write_jsonl, tmp_path):
    """A second generate on the same --out is refused naming the holder; a dead holder's lock is reused."""
    rows = prompts(400)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.01") as servers:
        first = generate(path, out, servers, "--concurrency", "2")
        wait_for_lines(out / "completions.jsonl", 5, 60)
        second = run_generate(path, out, servers, timeout=60)
        assert second.returncode == 1 and f"in use by pid {first.pid} on " in second.stderr
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
        assert (out / ".lock").read_text().startswith(f"pid {first.pid}")  # stale: its holder is dead
        third = run_generate(path, out, servers, "--concurrency", "32", timeout=120)
    assert third.returncode == 0, third.stderr
    check_invariant([r["id"] for r in rows], out)


def test_retry_failed_picks_exactly_the_named_reasons(write_jsonl, tmp_path):
    """--retry-failed resends exactly the rows whose newest ledger reason it names."""
    rows = prompts(10)
    path, out = write_jsonl(rows), tmp_path / "out"
    out.mkdir()
    ledger = [
        (0, "bad_request"),
        (1, "bad_request"),
        (2, "context_overflow"),
        (3, "over_length"),
        (4, "timeout"),
        (5, "over_length"),
        (5, "context_overflow"),
    ]
    run_sim(write_jsonl([], "empty.jsonl"), out)  # writes the manifest of this fleet/tokenizer
    with (out / "failures.jsonl").open("ab") as f:
        for rid, reason in ledger:
            f.write(orjson.dumps({"id": rid, "line": rid + 1, "reason": reason}) + b"\n")
    outcome, fleet = run_sim(path, out, retry_failed=frozenset({"bad_request", "over_length"}))
    assert outcome.summary["skipped"] == {"context_overflow": 2}  # ids 2 and 5 (newest entry wins)
    assert outcome.summary["completed"] == 8
    sent = {r["id"] for r in read_jsonl(out / "completions.jsonl")}
    assert sent == {0, 1, 3, 4, 6, 7, 8, 9}
    assert sum(s.requests for s in fleet.stats.values()) == 8


def test_kill_9_campaign_with_samples_and_faults(write_jsonl, tmp_path):
    """--samples 4 under SIGKILLs at random moments on a faulty fleet: after resuming, exactly 4 lines per
    prompt with samples 0-3, nothing twice, each answer one the server gave for that prompt."""
    import hashlib

    rows = prompts(300)
    path, out, log = write_jsonl(rows), tmp_path / "out", tmp_path / "requests.jsonl"
    rng = random.Random(23)
    faults = ("--token-latency", "0.003", "--p500", "0.05", "--p-drop", "0.05", "--seed", "6")
    run = ("--samples", "4", "--concurrency", "8", "--grace-period", "1")
    kills = 0
    with sim_fleet(4, *faults, "--request-log", str(log)) as servers:
        while kills < 8 and len(read_jsonl(out / "completions.jsonl")) < 1100:
            before = len(read_jsonl(out / "completions.jsonl"))
            proc = generate(path, out, servers, *run)
            wait_for_lines(out / "completions.jsonl", before + 20, 60)
            time.sleep(rng.random() * 0.4)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            kills += 1
            _all_lines_valid(out)
        for _ in range(4):  # transient failures (faults) are retried by a plain rerun
            final = run_generate(path, out, servers, *run)
            if final.returncode == 0:
                break
    assert final.returncode == 0, final.stderr
    lines = read_jsonl(out / "completions.jsonl")
    keys = [(r["id"], r["sample"]) for r in lines]
    assert len(keys) == len(set(keys)) == 1200, "a (id, sample) was written twice or lost"
    by_id: dict[int, list[int]] = {}
    for rid, sample in keys:
        by_id.setdefault(rid, []).append(sample)
    assert all(sorted(s) == [0, 1, 2, 3] for s in by_id.values()) and len(by_id) == 300
    given: dict[str, set[str]] = {}
    for r in read_jsonl(log):
        given.setdefault(r["prompt"], set()).update(r["texts"])
    digest = {r["id"]: hashlib.blake2b(orjson.dumps(r["messages"]), digest_size=8).hexdigest() for r in rows}
    assert all(r["completion"] in given[digest[r["id"]]] for r in lines)
    assert kills >= 3
    requests = len(read_jsonl(log))
    print(f"\nsamples kill -9 campaign: kills={kills} prompts=300 lines=1200 duplicates=0 server requests={requests}")


def test_kill_9_campaign_over_claimers_on_separate_fleets(write_jsonl, tmp_path):
    """Three claimers (`--join`), each on its own simulated fleet; SIGKILLs of a random one at random moments,
    each replaced by a new claimer on the same fleet; then claimers finish the run: every id exactly once,
    every line of every shard valid, every shard settled."""
    from gen_pipeline.rundir.layout import RunDir

    rows = prompts(1500)
    path, out = write_jsonl(rows), tmp_path / "out"
    rng = random.Random(23)
    args = ("--shards", "48", "--concurrency", "4", "--grace-period", "1")
    with (
        sim_fleet(2, "--token-latency", "0.003", "--seed", "3") as a,
        sim_fleet(2, "--token-latency", "0.003", "--seed", "4") as b,
        sim_fleet(2, "--token-latency", "0.003", "--seed", "5") as c,
    ):
        fleets = [a, b, c]
        claimers = [generate(path, out, fleet, "--join", *args) for fleet in fleets]
        kills = 0
        for _ in range(8):
            time.sleep(0.3 + rng.random() * 0.7)
            victim = rng.randrange(3)
            if claimers[victim].poll() is None:
                claimers[victim].send_signal(signal.SIGKILL)
                kills += 1
            claimers[victim].communicate(timeout=60)
            assert claimers[victim].returncode in (-9, 0), claimers[victim].returncode
            for files in (RunDir(out).completion_files(), RunDir(out).failure_files()):
                for p in files:
                    for line in p.read_bytes().splitlines():
                        orjson.loads(line)  # a torn tail is repaired by the next claimer, never a bad line
            claimers[victim] = generate(path, out, fleets[victim], "--join", *args)
        for proc in claimers:
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err
        final = run_generate(path, out, a, "--join", *args)
        assert final.returncode == 0, final.stderr
    assert kills >= 5
    assert check_invariant([r["id"] for r in rows], out) == {"done": 1500, "ledger": 0}
    assert all(RunDir(out).shard(s).settled.exists() for s in range(48))
