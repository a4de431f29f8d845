"""kill -9 campaigns over the inputs of issue 53: a Parquet file, and rows of columns rendered by --template. Every
id ends in the output exactly once, every line is valid, and resumes start at the input cursor."""

from __future__ import annotations

import random
import signal
import time

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e import check_invariant, prompts, read_jsonl
from procs import generate, run_generate, sim_fleet, wait_for_lines

pytestmark = pytest.mark.slow


def _all_lines_valid(out) -> None:
    for name in ("completions.jsonl", "failures.jsonl"):
        path = out / name
        if path.exists():
            for line in path.read_bytes().splitlines():
                orjson.loads(line)


def _campaign(path, out, servers, rng, kills_wanted, rows, *args):
    """Start, wait for a few more lines, kill -9 at a random moment; `kills_wanted` times."""
    kills = 0
    while kills < kills_wanted and len(read_jsonl(out / "completions.jsonl")) < rows:
        before = len(read_jsonl(out / "completions.jsonl"))
        proc = generate(path, out, servers, "--concurrency", "8", "--grace-period", "1", *args)
        wait_for_lines(out / "completions.jsonl", before + 10, 60)
        time.sleep(rng.random() * 0.4)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        kills += 1
        _all_lines_valid(out)
    return kills


def test_kill_9_campaign_over_a_parquet_input(tmp_path):
    """Ten SIGKILLs over a Parquet input of small row groups, each followed by a resume: one line per id; a rerun
    of the finished run starts at its input cursor, past every row."""
    rows = prompts(1200)
    path, out = tmp_path / "prompts.parquet", tmp_path / "out"
    pq.write_table(pa.Table.from_pylist([{**r, "src": "pq"} for r in rows]), path, row_group_size=64)
    rng = random.Random(17)
    with sim_fleet(4, "--token-latency", "0.003", "--seed", "2") as servers:
        kills = _campaign(path, out, servers, rng, 10, len(rows))
        final = run_generate(path, out, servers)
        again = run_generate(path, out, servers)
    assert final.returncode == 0, final.stderr
    assert again.returncode == 0, again.stderr
    assert kills >= 10
    assert check_invariant([r["id"] for r in rows], out) == {"done": 1200, "ledger": 0}
    lines = read_jsonl(out / "completions.jsonl")
    assert all(r["meta"] == {"src": "pq"} for r in lines)
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["input_cursor"]["line"] == 1200 and summary["completed"] == 0
    print(f"\nparquet kill -9 campaign: kills={kills} rows=1200 duplicates=0 lost=0")


def test_kill_9_campaign_over_a_template_input(tmp_path, write_jsonl):
    """Ten SIGKILLs over rows of columns rendered by --template (some without an id, one row that lacks the column):
    every row once in the output, the bad one once in the ledger, each line's prompt the rendered template."""
    rows = [{"id": f"t{i}", "topic": f"topic {i}", "words": 1 + i % 7} for i in range(900)]
    rows += [{"topic": f"no id {i}", "words": 3} for i in range(100)]
    rows.append({"id": "bad", "words": 2})
    path, out = write_jsonl(rows), tmp_path / "out"
    template = tmp_path / "ask.j2"
    template.write_text("Write {{ words }} words about {{ topic }}.\n")
    rng = random.Random(29)
    with sim_fleet(4, "--token-latency", "0.003", "--seed", "3") as servers:
        kills = _campaign(path, out, servers, rng, 10, 1000, "--template", str(template))
        final = run_generate(path, out, servers, "--template", str(template))
    assert final.returncode == 0, final.stderr
    assert kills >= 10
    lines = read_jsonl(out / "completions.jsonl")
    ids = [r["id"] for r in lines]
    assert len(ids) == len(set(ids)) == 1000
    ledger = read_jsonl(out / "failures.jsonl")
    assert [(e["id"], e["reason"]) for e in ledger] == [("bad", "bad_input")]
    assert "column 'topic'" in ledger[0]["detail"]
    by_topic = {r["meta"]["topic"]: r for r in lines}
    assert by_topic["topic 5"]["messages"] == [{"role": "user", "content": "Write 6 words about topic 5."}]
    check_invariant([r["id"] for r in rows if "id" in r], out)
    print(f"\ntemplate kill -9 campaign: kills={kills} rows=1001 duplicates=0 lost=0")
