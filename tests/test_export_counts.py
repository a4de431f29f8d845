"""`export` says what it wrote: the printed counts, the card and the rows agree, for every combination of the
--drop-* flags, over a `--turns last` and a `--turns all` run of the simulator."""

from __future__ import annotations

import argparse
import itertools
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from e2e import conversation_rows, read_jsonl, run_sim

from gen_pipeline.cli import export as cli_export

# Answers cut while thinking, cut while answering, and whole; conversations of 1 and 2 turns, two that end
# early (their next turn no longer fits the context) and one whose first turn never fits (ledgered).
SIM = {"n_ports": 2, "context_length": 400, "reasoning_words": 12, "completion_words": 10}
FLAGS = ("--drop-truncated", "--drop-truncated-reasoning", "--drop-incomplete")


def _long(n: int, turns: int, words: int) -> dict[str, Any]:
    """A conversation whose user turns (each after an old answer) soon no longer fit the context."""
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"{n} {t} " + "word " * words})
        messages.append({"role": "assistant", "content": f"old answer {t}"})
    return {"id": f"long{n}", "messages": messages}


def mixed_rows() -> list[dict[str, Any]]:
    return [_long(1, 6, 60), _long(2, 4, 70), _long(3, 4, 80), *conversation_rows(8, turns=1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same rows generated with --turns last and with --turns all, two samples each."""
    tmp = tmp_path_factory.mktemp("counts")
    inp = tmp / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in mixed_rows()))
    out = {}
    for turns in ("last", "all"):
        out[turns] = tmp / turns
        run_sim(inp, out[turns], sim=SIM, turns=turns, samples=2, max_tokens=9, min_tokens=1)
    return out


def run_export(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    code = cli_export.main(parser.parse_args([str(a) for a in argv]))
    return code, capsys.readouterr().out


def card_counts(out: Path) -> dict[str, str]:
    """The card's "Counts" table, label -> value."""
    card = (out / "README.md").read_text()
    table = card.split("## Counts", 1)[1].split("\n## ", 1)[0]
    return {m[1]: m[2] for m in re.finditer(r"^\| (.+?) \| (.*?) \|$", table, re.M) if m[1].strip()}


def card_checkpoint_rows(out: Path) -> int:
    card = (out / "README.md").read_text()
    table = card.split("## Checkpoints", 1)[1].split("\n## ", 1)[0]
    return sum(
        int(line.rsplit("|", 2)[1]) for line in table.splitlines() if line.startswith("| ") and "rows |" not in line
    )


def expected(lines: list[dict[str, Any]], turns_all: bool, flags: set[str]) -> dict[str, Any]:
    """What the export should hold, worked out from the completion lines alone."""

    def left_out(line: dict[str, Any]) -> bool:
        cut = "--drop-truncated" in flags and line["finish_reason"] == "length"
        return cut or ("--drop-truncated-reasoning" in flags and line.get("truncated_in") == "reasoning")

    truncated = sum(map(left_out, lines))
    if not turns_all:
        rows = sorted((str(x["id"]), x["sample"]) for x in lines if not left_out(x))
        return {"rows": rows, "lines_in_rows": len(rows), "truncated": truncated}
    conversations: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        conversations[(str(x["id"]), x["sample"])].append(x)
    kept, with_hole, ended_dropped = [], 0, 0
    for key, turns in conversations.items():
        if any(map(left_out, turns)):
            with_hole += 1
        elif "--drop-incomplete" in flags and len(turns) != turns[0]["turns"]:
            ended_dropped += 1
        else:
            kept.append(key)
    complete = sum(len(conversations[k]) == conversations[k][0]["turns"] for k in kept)
    return {
        "rows": sorted(kept),
        "lines_in_rows": sum(len(conversations[k]) for k in kept),
        "truncated": truncated,
        "conversations": len(conversations),
        "complete": complete,
        "ended_early": len(kept) - complete,
        "with_hole": with_hole,
        "ended_dropped": ended_dropped,
    }


COMBINATIONS = [
    (turns, set(flags))
    for turns in ("last", "all")
    for n in range(4 if turns == "all" else 3)
    for flags in itertools.combinations(FLAGS if turns == "all" else FLAGS[:2], n)
]


@pytest.mark.parametrize(
    ("turns", "flags"), COMBINATIONS, ids=[f"{t}:{'+'.join(sorted(f)) or 'none'}" for t, f in COMBINATIONS]
)
def test_the_printed_counts_the_card_and_the_rows_agree(runs, tmp_path, capsys, turns, flags):
    """Every --drop-* combination: the rows are the ones the completion lines call for, and the printed line,
    the card's counts and its per-checkpoint rows all say that number; what was left out adds up."""
    run = runs[turns]
    lines = read_jsonl(run / "completions.jsonl")
    want = expected(lines, turns == "all", flags)
    out = tmp_path / "ds"
    code, printed = run_export(capsys, run, "--out", out, *sorted(flags))
    assert code == 0
    table = pq.read_table(next((out / "data").glob("*.parquet"))).to_pylist()
    assert sorted((r["id"], r["sample"]) for r in table) == want["rows"]
    n = len(want["rows"])
    counts = card_counts(out)
    assert int(counts["rows"]) == n and card_checkpoint_rows(out) == n
    assert f"export: {n} rows from {want['lines_in_rows']} completion lines -> {out}" in printed, printed
    assert sum(int(x.rsplit(" ", 1)[1]) for x in counts["finish reasons"].split(", ")) == want["lines_in_rows"]
    assert int(counts["left out: truncated (finish_reason length)"]) == want["truncated"]
    assert f"left out: {want['truncated']} truncated" in printed
    if turns == "last":
        return
    assert int(counts["conversations: complete"]) == want["complete"]
    assert int(counts["conversations: ended early"]) == want["ended_early"]
    assert int(counts["turns in the rows"]) == want["lines_in_rows"]
    assert int(counts["left out: conversations with a turn left out"]) == want["with_hole"]
    assert int(counts["left out: conversations ended early (--drop-incomplete)"]) == want["ended_dropped"]
    dropped_turns = int(counts["left out: turns of the conversations left out"])
    assert want["lines_in_rows"] + want["truncated"] + dropped_turns == len(lines)
    said = (
        f"export: {n} conversations ({want['complete']} complete, {want['ended_early']} ended early) of "
        f"{want['conversations']} (left out: {want['with_hole']} with a turn left out, {want['ended_dropped']} "
        "ended early"
    )
    assert said in printed, printed
    assert "-" not in re.sub(r"\S*/\S*|--[a-z-]+", "", printed.split("\n", 1)[0])  # no negative count


def test_nothing_left_writes_an_empty_dataset_and_says_so(tmp_path, capsys):
    """Every conversation ended early and --drop-incomplete: an empty dataset with its columns, a clear line,
    exit 0 (it ended in a traceback, "Instruction 'train' corresponds to no data")."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in mixed_rows()[:2]))
    run_sim(inp, tmp_path / "run", sim=SIM, turns="all", max_tokens=9, min_tokens=1)
    out = tmp_path / "ds"
    code, printed = run_export(capsys, tmp_path / "run", "--out", out, "--drop-incomplete")
    assert code == 0
    assert f"export: nothing left to export: an empty dataset (0 rows) -> {out}" in printed, printed
    table = pq.read_table(next((out / "data").glob("*.parquet")))
    assert table.num_rows == 0 and {"messages", "id", "conversation"} <= set(table.column_names)
    counts = card_counts(out)
    assert (counts["rows"], counts["left out: conversations ended early (--drop-incomplete)"]) == ("0", "2")
