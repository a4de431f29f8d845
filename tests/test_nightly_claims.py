"""Nightly expansion of a claimed-shard run directory (claims.py): a night's new rows reopen only the shards
they fall in, settled rows are never sent again, and the export holds every key once."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from e2e import check_invariant, prompts, read_jsonl
from procs import PY, env, generate, sim_fleet
from test_nightly import clean_env, nightly, source_rows
from test_nightly import write_jsonl as write_source

from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.shards.claims import input_shards, shard_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "gen_pipeline" / "data" / "tiny-tokenizer"
SHARDS = 16


def requests(log: Path) -> int:
    """Chat requests the simulator answered (its --request-log)."""
    return log.read_bytes().count(b"\n") if log.exists() else 0


def served(out: Path) -> Counter[str]:
    """How often each id is in the run's completion files (every shard's)."""
    return Counter(str(r["id"]) for path in RunDir(out).completion_files() for r in read_jsonl(path))


def markers(out: Path) -> dict[int, dict[str, Any]]:
    """Each shard's settled marker (a shard without one is left out)."""
    rundir, found = RunDir(out), {}
    for s in range(SHARDS):
        if rundir.shard(s).settled.exists():
            found[s] = orjson.loads(rundir.shard(s).settled.read_bytes())
    return found


def exported(out: Path, tmp_path: Path) -> Counter[str]:
    """`gen-pipeline export OUT` (it refuses open shards and a key written twice): the exported ids."""
    ds = tmp_path / "dataset"
    done = subprocess.run([PY, "-m", "gen_pipeline", "export", out, "--out", ds], env=env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Counter(str(i) for p in sorted(ds.glob("data/*.parquet")) for i in pq.read_table(p, columns=["id"])["id"])


def test_input_shards_are_the_shards_a_pass_gives_each_row(tmp_path):
    """A row falls in its id key's shard; a broken one (no id to read) in its line number's."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(3, start=40)) + b"{broken\n")
    expected = {shard_of(i, None, 64) for i in (40, 41, 42)} | {4}  # line 4
    assert input_shards(inp, 64, set(range(64))) == expected
    assert input_shards(inp, 64, {4}) == {4} and input_shards(inp, 64, set(range(64)) - expected) == set()


def test_a_night_reopens_only_the_shards_of_its_new_rows(tmp_path):
    """run/nightly.sh over a claimed-shard dataset (--shards, two claimers by --workers 2): the source grows
    by three new prompts and repeats of old ones; the next night sends exactly the three, reopens only their
    shards (the others are settled without a pass, their files untouched), and the export has every key once."""
    ds, src, log = tmp_path / "ds", tmp_path / "source.jsonl", tmp_path / "requests.jsonl"
    first = [f"Question {i}: tell me about topic {i}" for i in range(60)]
    write_source(src, source_rows(first))
    args = ["--", "--max-tokens", "32", "--progress", "off", "--workers", "2"]
    with sim_fleet(2, "--request-log", str(log), "--tokenizer", str(TINY)) as servers:
        env_ = clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers, NIGHTLY_TOKENIZER=str(TINY))
        one = nightly("--dataset-dir", ds, "--date", "2026-01-01", *args, "--shards", str(SHARDS), env=env_)
        assert one.returncode == 0, one.stdout + one.stderr
        assert requests(log) == 60 and sum(served(ds).values()) == 60
        assert "completions in " + str(ds) + ": 60" in one.stdout  # the log counts the shards' files
        before = {p: p.read_bytes() for p in RunDir(ds).completion_files()}

        new = ["A brand new question", "Another new one", "And a third"]
        write_source(src, source_rows([*first, new[0], first[3], new[1], first[7], first[3], new[2]]))
        two = nightly("--dataset-dir", ds, "--date", "2026-01-02", *args, env=env_)
        assert two.returncode == 0, two.stdout + two.stderr
    tonight = [r["id"] for r in read_jsonl(ds / "prompts" / "nightly-2026-01-02.jsonl")]
    assert len(tonight) == 3  # prepare left out the repeats of old prompts
    assert requests(log) == 63  # only the three were sent
    reopened = {shard_of(i, None, SHARDS) for i in tonight}
    after = markers(ds)
    assert sorted(after) == list(range(SHARDS))
    assert {s for s, m in after.items() if not m.get("empty")} == reopened
    assert all(m["input"]["name"] == "nightly-2026-01-02.jsonl" for m in after.values())
    for path, data in before.items():
        if int(path.parent.name) not in reopened:
            assert path.read_bytes() == data, path  # a settled shard's file is not even rewritten
    summary = orjson.loads((ds / "summary.json").read_bytes())
    assert summary["completed"] == 3 and summary["claimers"] == 2 and summary["warnings"] == [], summary
    assert "completions in " + str(ds) + ": 63" in two.stdout
    assert exported(ds, tmp_path) == Counter({str(i): 1 for i in served(ds)}) and len(served(ds)) == 63


def claimers_on(fleets: list[str], inp: Path, out: Path) -> None:
    """One `generate --join` claimer per fleet (a node each), run to the end."""
    procs = [generate(inp, out, servers, "--join", "--shards", str(SHARDS), "--concurrency", "4", "--max-tokens",
                      "32", "--tokenizer", str(TINY)) for servers in fleets]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def test_a_grown_input_sends_only_its_new_rows(write_jsonl, tmp_path):
    """Two claimers on two fleets settle a run; the input file then grows by new rows and repeats of old
    ones; two claimers again send exactly the new rows: every key once, all settled."""
    rows = prompts(200)
    inp, out = write_jsonl(rows), tmp_path / "out"
    logs = [tmp_path / "requests-a.jsonl", tmp_path / "requests-b.jsonl"]
    sim = ["--token-latency", "0.002", "--tokenizer", str(TINY)]
    with sim_fleet(2, *sim, "--request-log", str(logs[0])) as a, sim_fleet(2, *sim, "--request-log", str(logs[1])) as b:
        claimers_on([a, b], inp, out)
        assert sum(map(requests, logs)) == 200 and sorted(markers(out)) == list(range(SHARDS))
        night = prompts(40, start=1000)
        with inp.open("ab") as f:  # tonight's rows, and old rows again (the same key, the same content)
            f.write(b"".join(orjson.dumps(r) + b"\n" for r in [*night[:20], *rows[:10], *night[20:], rows[50]]))
        first = [requests(p) for p in logs]
        claimers_on([a, b], inp, out)
    sent = [requests(p) - n for p, n in zip(logs, first, strict=True)]
    assert sum(sent) == 40, sent  # only the new rows, each once
    assert check_invariant([r["id"] for r in [*rows, *night]], out) == {"done": 240, "ledger": 0}
    assert all(m["input"]["size"] == inp.stat().st_size for m in markers(out).values())
    assert len(markers(out)) == SHARDS
    assert exported(out, tmp_path) == Counter({str(r["id"]): 1 for r in [*rows, *night]})


def test_a_claimer_that_finds_nothing_to_claim_still_reports(write_jsonl, tmp_path):
    """--workers 2 over one shard: one worker claims it, the other finds nothing open; both are counted in
    summary.json and no summary is reported missing (a quiet night leaves most claimers idle)."""
    inp, out = write_jsonl(prompts(20)), tmp_path / "out"
    with sim_fleet(2, "--tokenizer", str(TINY)) as servers:
        p = generate(inp, out, servers, "--shards", "1", "--workers", "2", "--tokenizer", str(TINY))
        _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert (summary["completed"], summary["claimers"], summary["warnings"]) == (20, 2, []), summary
