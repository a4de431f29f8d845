"""One checkpoint per conversation in `export`: of a --turns all run that went on under a new checkpoint
(--accept-checkpoint), each conversation is one row, its newest whole version, every turn from one
checkpoint; the card's per-checkpoint counts are rows and the printed counts agree with them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from gen_pipeline.cli import export as cli_export
from gen_pipeline.fleet.provenance import ServerIdentity

OLD = {"kind": "sglang", "version": "0.5.23", "model_path": "/ckpt/step-1000", "weight_version": "v1"}
NEW = {**OLD, "model_path": "/ckpt/step-2000", "weight_version": "v2"}
A, B = (ServerIdentity.from_record(r).fingerprint for r in (OLD, NEW))
TURNS = 3


def turn_lines(cid: str, checkpoint: str, turns: range, turns_in_row: int = TURNS) -> list[dict[str, Any]]:
    """A conversation's turn lines as `checkpoint` wrote them, each asked with the answers before it."""
    out, history = [], []
    for t in range(turns.stop):
        history.append({"role": "user", "content": f"{cid} question {t}"})
        answer = f"{cid} answer {t} by {checkpoint}"
        if t in turns:
            out.append(
                {"id": cid, "sample": 0, "turn": t, "turns": turns_in_row, "messages": list(history)}
                | {"completion": answer, "finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 4}
                | {"checkpoint": checkpoint, "model": "m"}
            )
        history.append({"role": "assistant", "content": answer})
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """c0: begun under the old checkpoint, answered again whole under the new one; c1: finished under the old;
    c2: continued on the old one's answers by the new one (as runs did before); c3: begun again under the
    new one, not finished yet."""
    lines = [
        *turn_lines("c0", A, range(2)),
        *turn_lines("c1", A, range(3)),
        *turn_lines("c2", A, range(1)),
        *turn_lines("c3", A, range(1)),
        *turn_lines("c0", B, range(3)),
        *turn_lines("c2", B, range(1, 3)),
        *turn_lines("c3", B, range(1)),
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "completions.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    manifest = {"model": "m", "turns": "all", "provenance": {"checkpoints": [OLD, NEW]}}
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    return run


def run_export(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    assert cli_export.main(parser.parse_args([str(a) for a in argv])) == 0
    return capsys.readouterr().out


def test_each_conversation_is_its_newest_whole_version(run, tmp_path, capsys):
    """One row per conversation, every answer in it from the row's checkpoint; the card's checkpoint table
    counts rows; the printed line names what was left out and why."""
    printed = run_export(capsys, run, "--out", tmp_path / "ds")
    rows = {r["id"]: r for r in pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()}
    assert {k: (r["checkpoint"], r["conversation"], r["turns"]) for k, r in rows.items()} == {
        "c0": (B, "complete", 3),
        "c1": (A, "complete", 3),
        "c2": (A, "ended_early", 1),
        "c3": (B, "ended_early", 1),
    }
    for row in rows.values():
        answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert answers == [f"{row['id']} answer {t} by {row['checkpoint']}" for t in range(row["turns"])]
    card = (tmp_path / "ds" / "README.md").read_text()
    per_checkpoint = dict(re.findall(r"^\| (\w{12}) \|.*\| (\d+) \|$", card, re.M))
    assert per_checkpoint == {A: "2", B: "2"}
    assert "| left out: conversations answered again under a newer checkpoint | 2 |" in card
    assert "| left out: conversations continued on another checkpoint's answers | 1 |" in card
    assert "| turns in the rows | 8 |" in card and "| left out: turns of the conversations left out | 5 |" in card
    assert (
        "export: 4 conversations (2 complete, 2 ended early) of 7 (left out: 0 with a turn left out, 0 ended early "
        "(--drop-incomplete), 2 answered again under a newer checkpoint, 1 continued on another checkpoint's "
        "answers)"
    ) in printed, printed
    assert f"export: 4 rows from 8 completion lines -> {tmp_path / 'ds'}" in printed


def test_drop_incomplete_keeps_the_finished_conversations_only(run, tmp_path, capsys):
    """--drop-incomplete: the two finished conversations, each under the checkpoint that finished it."""
    printed = run_export(capsys, run, "--out", tmp_path / "ds", "--drop-incomplete")
    rows = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()
    assert sorted((r["id"], r["checkpoint"]) for r in rows) == [("c0", B), ("c1", A)]
    assert "export: 2 conversations (2 complete, 0 ended early) of 7" in printed


def test_a_run_redeployed_mid_conversation_exports_each_conversation_under_one_checkpoint(tmp_path, capsys):
    """The issue's campaign on the simulator: the fleet is redeployed mid-run, the run goes on with
    --accept-checkpoint; every conversation is one complete row whose answers are all its checkpoint's (the
    ones cut by the redeploy answered again under the new one), and the printed count, its breakdown, the
    card's checkpoint table and the rows agree."""
    from e2e import conversation_rows, read_jsonl, run_sim

    from gen_pipeline.errors import FleetError

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in conversation_rows(8)))
    old = {"n_ports": 1, "model_path": "/ckpt/step-1000", "weight_version": "v1"}
    redeployed = {**old, "per_port": lambda ports: {"redeploy": {ports[0]: (9, "v2")}}}
    with pytest.raises(FleetError, match="redeployed mid-run"):
        run_sim(inp, tmp_path / "run", sim=redeployed, turns="all", concurrency=2, max_tokens=16)
    run_sim(inp, tmp_path / "run", sim={**old, "weight_version": "v2"}, turns="all", accept_checkpoint=True)
    lines = {
        (x["id"], x["checkpoint"], x["turn"]): x["completion"]
        for x in read_jsonl(tmp_path / "run" / "completions.jsonl")
    }
    assert len({c for _, c, _ in lines}) == 2  # both checkpoints answered some turns
    printed = run_export(capsys, tmp_path / "run", "--out", tmp_path / "ds")
    rows = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()
    assert sorted(r["id"] for r in rows) == [f"c{i}" for i in range(8)]
    for row in rows:
        answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert answers == [lines[(row["id"], row["checkpoint"], t)] for t in range(row["turns"])], row["id"]
    card = (tmp_path / "ds" / "README.md").read_text()
    per_checkpoint = [int(n) for n in re.findall(r"^\| \w{12} \|.*\| (\d+) \|$", card, re.M)]
    assert sum(per_checkpoint) == len(rows) == 8
    said = re.search(r"export: (\d+) conversations \((\d+) complete, (\d+) ended early\) of (\d+)", printed)
    assert said is not None and int(said[1]) == int(said[2]) + int(said[3]) == 8, printed
    # generate answered each conversation cut by the redeploy again from its first turn: all are whole
    assert said[2] == "8" and {r["conversation"] for r in rows} == {"complete"}
    left = sum(int(n) for n in re.findall(r"\| left out: conversations [^|]* \| (\d+) \|", card))
    assert int(said[4]) == 8 + left
