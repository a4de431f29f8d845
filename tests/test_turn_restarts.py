"""A conversation is never continued on a history its input no longer has, nor on another checkpoint's
answers: it is answered again from turn 0 under the next restart generation (samples.py), whose lines win
over the old ones in resume, status and export."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
from e2e import SYSTEM, conversation_rows, read_jsonl, run_sim

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.export.export import ExportConfig, export
from gen_pipeline.modes import run_async
from gen_pipeline.resume.ledger import ledger_reasons
from gen_pipeline.send.turns import answer_turn, split_turns
from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.views.status import file_counts

NIGHT1 = {"model_path": "/ckpt/step-1000", "weight_version": "v1"}
NIGHT2 = {"model_path": "/ckpt/step-2000", "weight_version": "v2"}


def cut_short(out: Path, ids: tuple[str, ...]) -> None:
    """Keep only turn 0 of these conversations, as a crash after their first answers leaves them."""
    done = out / "completions.jsonl"
    kept = [r for r in read_jsonl(done) if not (r["id"] in ids and r["turn"] > 0)]
    done.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    shutil.rmtree(out / ".index")


def standing_lines(out: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The output's lines of each conversation's newest restart generation, by (id, sample, turn)."""
    lines = read_jsonl(out / "completions.jsonl")
    newest: dict[tuple[str, int], int] = {}
    for r in lines:
        newest[(r["id"], r["sample"])] = max(newest.get((r["id"], r["sample"]), 0), r.get("restart", 0))
    standing = [r for r in lines if r.get("restart", 0) == newest[(r["id"], r["sample"])]]
    return {(r["id"], r["sample"], r["turn"]): r for r in standing}


def assert_whole(rows: list[dict[str, Any]], lines: dict[tuple[str, int, int], dict[str, Any]]) -> None:
    """Every standing turn was asked with the row's current user turns and the answers of its own generation."""
    for (rid, s, t), line in lines.items():
        segments = split_turns(next(r for r in rows if r["id"] == rid)["messages"])
        history: list[Any] = []
        if t:
            before = lines[(rid, s, t - 1)]
            assert before.get("restart", 0) == line.get("restart", 0)
            history = [*before["messages"], answer_turn(before["completion"], before.get("reasoning_content"))]
        assert line["messages"] == [*history, *segments[t]], (rid, s, t)


def test_a_conversation_whose_earlier_turn_was_edited_is_answered_again_from_turn_0(write_jsonl, tmp_path):
    """c1's first user turn is edited while c1 is half done: it is answered again from turn 0 (restart 1),
    never continued as a hybrid; c4, whose later turn only was edited, goes on where it was. The summary
    counts and names c1; a rerun sends nothing; status and export read only c1's new answers."""
    rows = conversation_rows(6)
    path, out = write_jsonl(rows), tmp_path / "out"
    run_sim(path, out, sim={"n_ports": 2}, turns="all")
    cut_short(out, ("c1", "c4"))
    with (out / "failures.jsonl").open("ab") as ledger:  # a transient failure of the old c1 at turn 1
        entry = {"id": "c1", "sample": 0, "turn": 1, "line": 2, "reason": "timeout", "detail": "x", "time": 1.0}
        ledger.write(orjson.dumps(entry) + b"\n")
    rows[1]["messages"][1]["content"] = "c1 EDITED first question"
    rows[4]["messages"][-2]["content"] = "c4 EDITED last question"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    outcome, _ = run_sim(path, out, sim={"n_ports": 2}, turns="all")
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["conversations"]["restarted_edited"] == 1
    assert any("answered again from turn 0" in w and "'c1'" in w for w in outcome.summary["warnings"])
    lines = standing_lines(out)
    assert {k[0] for k, v in lines.items() if v.get("restart")} == {"c1"}
    assert len(lines) == sum(len(split_turns(r["messages"])) for r in rows)
    assert_whole(rows, lines)
    again, _ = run_sim(path, out, sim={"n_ports": 2}, turns="all")
    assert again.summary["requests"] == 0 and again.summary["skipped"] == {"done": 6}, again.summary
    assert ledger_reasons([out]) == {}
    assert file_counts(out, None).startswith(f"files: {len(lines)} completions")
    export(ExportConfig(runs=(out,), out=tmp_path / "ds"))
    table = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()
    assert len(table) == 6 and {r["conversation"] for r in table} == {"complete"}
    [c1] = [r for r in table if r["id"] == "c1"]
    assert c1["messages"][1]["content"] == "c1 EDITED first question"
    assert [m["content"] for m in c1["messages"] if m["role"] == "assistant"] == [
        lines[("c1", 0, t)]["completion"] for t in range(c1["turns"])
    ]


def night(sim: dict[str, Any], path: Path, out: Path, **run: Any) -> Any:
    async def go() -> Any:
        config = SimConfig(ports=tuple(free_ports(2)), health_delay=0.0, **sim)
        async with await start_fleet(config) as fleet:
            settings = {"retry": RetryPolicy.testing(), "progress": "off", "max_tokens": 32, **run}
            return await run_async(RunConfig(input=path, out=out, servers=tuple(fleet.urls), turns="all", **settings))

    return asyncio.run(asyncio.wait_for(go(), 60))


def test_a_conversation_begun_under_another_checkpoint_is_answered_again_under_the_new_one(write_jsonl, tmp_path):
    """After --accept-checkpoint, the conversations the old checkpoint left half done are answered again from
    turn 0 under the new one, never continued on the old answers; export keeps each conversation whole under
    one checkpoint: the finished ones the old checkpoint's, the restarted ones the new one's."""
    rows = [*conversation_rows(4), {"id": "sys", "messages": [SYSTEM, {"role": "user", "content": "hi"}]}]
    path, out = write_jsonl(rows), tmp_path / "out"
    night(NIGHT1, path, out)
    old = {r["id"]: r["checkpoint"] for r in read_jsonl(out / "completions.jsonl")}
    cut_short(out, ("c0", "c3"))
    outcome = night(NIGHT2, path, out, accept_checkpoint=True)
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["conversations"]["restarted_checkpoint"] == 2
    assert any("answered again from turn 0" in w and "'c0'" in w for w in outcome.summary["warnings"])
    lines = standing_lines(out)
    assert_whole(rows, lines)
    new = {r["checkpoint"] for k, r in lines.items() if k[0] in ("c0", "c3")}
    assert len(new) == 1 and new != {old["c0"]}
    assert all(r["checkpoint"] == old[k[0]] for k, r in lines.items() if k[0] not in ("c0", "c3"))
    export(ExportConfig(runs=(out,), out=tmp_path / "ds", columns=("id", "checkpoint")))
    table = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()
    assert sorted(r["id"] for r in table) == sorted(r["id"] for r in rows)
    assert {r["conversation"] for r in table} == {"complete"}
    for row in table:
        assert row["checkpoint"] == (new.copy().pop() if row["id"] in ("c0", "c3") else old[row["id"]])
