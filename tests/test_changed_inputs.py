"""Changed inputs are never silent (issue 53): an answered id whose prompt changed in the input is counted and
named; --redo-changed answers it again as the next restart generation (append-only, export keeps the newer);
a run directory resumed with another --input warns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
from e2e import read_jsonl, run_sim

from gen_pipeline.config import RunConfig
from gen_pipeline.export.export import export
from gen_pipeline.export.exportconfig import ExportConfig
from gen_pipeline.preflight.check import run_check
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.sim import SimConfig, free_ports, start_fleet


def rows(n: int, edited: dict[int, str] | None = None) -> list[dict[str, Any]]:
    edited = edited or {}
    return [{"id": f"r{i}", "prompt": edited.get(i, f"question {i}: tell me more")} for i in range(n)]


def lines(out: Path) -> list[dict[str, Any]]:
    return [r for p in RunDir(out).completion_files() for r in read_jsonl(p)]


def test_a_changed_prompt_is_counted_and_named_and_its_answer_kept(write_jsonl, tmp_path):
    """A rerun over an input whose answered rows changed says how many and which, sends nothing, and keeps the
    answers; the unchanged rows are simply done."""
    out = tmp_path / "out"
    run_sim(write_jsonl(rows(8)), out)
    path = write_jsonl(rows(8, {2: "an edited question", 5: "another edit"}))
    again, _ = run_sim(path, out)
    assert again.summary["changed_inputs"] == {"rows": 2, "redone": 0, "first": ["r2", "r5"]}
    assert again.summary["requests"] == 0 and again.summary["skipped"] == {"done": 8}
    assert any("2 answered row(s) have another prompt" in w and "'r2', 'r5'" in w for w in again.summary["warnings"])
    assert len(lines(out)) == 8


def test_check_names_the_changed_rows_before_the_run(write_jsonl, tmp_path):
    """check's plan over a run directory counts the changed rows and warns, naming them."""
    out = tmp_path / "out"
    run_sim(write_jsonl(rows(4)), out)
    path = write_jsonl(rows(4, {1: "edited"}))

    async def check() -> dict[str, Any]:
        config = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)
        async with await start_fleet(config) as fleet:
            cfg = RunConfig(input=path, out=out, servers=tuple(fleet.urls), max_tokens=64)
            return await run_check(cfg, resume=True)

    report = asyncio.run(asyncio.wait_for(check(), 60))
    assert report["plan"]["changed_inputs"] == {"rows": 1, "redone": 0, "first": ["r1"]}
    assert any("1 answered row(s) have another prompt" in w and "'r1'" in w for w in report["warnings"])


def test_redo_changed_answers_again_as_the_next_generation_and_export_keeps_the_newer(write_jsonl, tmp_path):
    """--redo-changed: the changed row gets a new line (restart 1) after its old one; a rerun finds nothing
    changed; export writes the newer answer only. It reads the input from the top, past its cursor."""
    out = tmp_path / "out"
    run_sim(write_jsonl(rows(6)), out)
    path = write_jsonl(rows(6, {3: "the new question three"}))
    noticed, _ = run_sim(path, out)  # said once; its cursor now covers every row
    assert noticed.summary["changed_inputs"]["rows"] == 1
    redo, _ = run_sim(path, out, redo_changed=True)
    assert redo.summary["input_cursor"] is None and redo.summary["completed"] == 1
    assert redo.summary["changed_inputs"] == {"rows": 1, "redone": 1, "first": ["r3"]}
    r3 = [r for r in lines(out) if r["id"] == "r3"]
    assert [r.get("restart", 0) for r in r3] == [0, 1]
    assert r3[1]["messages"] == [{"role": "user", "content": "the new question three"}]
    quiet, _ = run_sim(path, out, redo_changed=True)
    assert "changed_inputs" not in quiet.summary and quiet.summary["requests"] == 0
    export(ExportConfig(runs=(out,), out=tmp_path / "ds"))
    table = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()
    assert len(table) == 6
    assert next(r for r in table if r["id"] == "r3")["messages"][0]["content"] == "the new question three"


def test_a_redone_row_that_no_longer_fits_is_ledgered_in_its_generation(write_jsonl, tmp_path):
    """A row answered again whose new prompt is over_length is ledgered under its new generation: the next run
    reads it as settled, not as changed again."""
    out = tmp_path / "out"
    sim = {"n_ports": 1, "context_length": 400}
    run_sim(write_jsonl(rows(3)), out, sim=sim)
    path = write_jsonl(rows(3, {0: "word " * 600}))
    run_sim(path, out, sim=sim, redo_changed=True)
    [entry] = read_jsonl(out / "failures.jsonl")
    assert (entry["id"], entry["reason"], entry.get("restart")) == ("r0", "over_length", 1)
    again, _ = run_sim(path, out, sim=sim, redo_changed=True)
    assert again.summary["requests"] == 0 and "changed_inputs" not in again.summary
    assert len(read_jsonl(out / "failures.jsonl")) == 1 and again.summary["skipped"] == {"done": 2, "over_length": 1}


def test_a_conversation_whose_user_turns_changed_is_counted_and_redone_whole(write_jsonl, tmp_path):
    """--turns all: a complete conversation whose user turn was edited is counted; --redo-changed answers it
    again from its first turn as restart generation 1, every turn once."""

    def chat(i: int, second: str) -> dict[str, Any]:
        return {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": f"first {i}"},
                {"role": "assistant", "content": "old"},
                {"role": "user", "content": second},
            ],
        }

    out = tmp_path / "out"
    run_sim(write_jsonl([chat(0, "second 0"), chat(1, "second 1")]), out, turns="all")
    path = write_jsonl([chat(0, "second 0"), chat(1, "an edited second turn")])
    seen, _ = run_sim(path, out, turns="all")
    assert seen.summary["changed_inputs"] == {"rows": 1, "redone": 0, "first": ["c1"]}
    redo, _ = run_sim(path, out, turns="all", redo_changed=True)
    assert redo.summary["completed"] == 2
    new = sorted((r["turn"], r.get("restart", 0)) for r in lines(out) if r["id"] == "c1")
    assert new == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_another_input_into_the_same_out_warns(write_jsonl, tmp_path):
    """A run directory resumed with another --input says so; the same input (or a relative path to it) does not."""
    out = tmp_path / "out"
    first = write_jsonl(rows(2), "a.jsonl")
    run_sim(first, out)
    same, _ = run_sim(first, out)
    assert not any("another input" in w for w in same.summary["warnings"])
    other, _ = run_sim(write_jsonl(rows(3), "b.jsonl"), out)
    assert any("holds rows answered from another input" in w and "a.jsonl" in w for w in other.summary["warnings"])


def test_changed_rows_of_a_claimed_shard_run_are_counted(write_jsonl, tmp_path):
    """Claimers compare the answered rows of the shards they read, as a single run does."""
    out = tmp_path / "out"
    run_sim(write_jsonl(rows(20)), out, shards=4)
    again, _ = run_sim(write_jsonl(rows(20, {7: "changed", 11: "changed too"})), out, shards=4)
    assert again.summary["changed_inputs"]["rows"] == 2
    assert sorted(again.summary["changed_inputs"]["first"]) == ["r11", "r7"]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["changed_inputs"]["rows"] == 2
