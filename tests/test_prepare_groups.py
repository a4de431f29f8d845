"""`prepare --group-prefixes`: rows that begin alike are written together, the longest first; only the order
changes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline import cli
from gen_pipeline.errors import OutputError
from gen_pipeline.prepare import convert as prepare_view


def turns(conv: int, k: int, system: str | None = None) -> list[dict[str, str]]:
    """Conversation `conv` up to its user turn `k` (earlier answers given)."""
    out = [{"role": "system", "content": system}] if system else []
    for i in range(k + 1):
        out.append({"role": "user", "content": f"conversation {conv} question {i}"})
        if i < k:
            out.append({"role": "assistant", "content": f"conversation {conv} answer {i}"})
    return out


def run(src: Path, out: Path, *flags: str) -> list[dict[str, Any]]:
    assert cli.main(["prepare", "--input", str(src), "--out", str(out), *flags]) == 0
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def conv_of(row: dict[str, Any]) -> str:
    return row["messages"][-1]["content"].split(" question ")[0]


def test_a_conversations_rows_are_written_together_longest_first(tmp_path):
    """Shuffled rows of 30 conversations (4 rows each, turns 1..k) and 20 one-turn prompts: grouped by
    conversation, groups in the order their first row was read, each group's rows by messages, most first;
    every row once, its line unchanged."""
    rng = random.Random(3)
    rows = [{"messages": turns(c, k, "Be brief." if c % 2 else None)} for c in range(30) for k in range(4)]
    rows += [{"messages": [{"role": "user", "content": f"single {i}"}]} for i in range(20)]
    rng.shuffle(rows)
    src = write(tmp_path / "src.jsonl", rows)
    plain = run(src, tmp_path / "plain.jsonl")
    grouped = run(src, tmp_path / "grouped.jsonl", "--group-prefixes")
    assert sorted(orjson.dumps(r) for r in grouped) == sorted(orjson.dumps(r) for r in plain)
    assert len(grouped) == 140
    # the order groups start in is the order of their first row in the plain (read) order
    first_seen: list[str] = []
    for r in plain:
        if (c := conv_of(r)) not in first_seen:
            first_seen.append(c)
    runs: list[tuple[str, list[int]]] = []
    for r in grouped:
        c = conv_of(r)
        if not runs or runs[-1][0] != c:
            runs.append((c, []))
        runs[-1][1].append(len(r["messages"]))
    assert [c for c, _ in runs] == first_seen  # each conversation is one run of rows, none split
    for c, lengths in runs:
        assert lengths == sorted(lengths, reverse=True), c
        assert len(lengths) == (1 if c.startswith("single") else 4)


def test_rows_sharing_only_a_system_prompt_stay_in_read_order(tmp_path):
    """The group is the messages up to the first user turn: one system prompt over different questions is
    not a conversation, and those rows keep their order."""
    rows = [{"messages": [{"role": "system", "content": "Shared."}, {"role": "user", "content": f"q{i}"}]}
            for i in range(10)]  # fmt: skip
    src = write(tmp_path / "src.jsonl", rows)
    grouped = run(src, tmp_path / "out.jsonl", "--group-prefixes")
    assert [r["messages"][1]["content"] for r in grouped] == [f"q{i}" for i in range(10)]


def test_tools_are_part_of_the_group(tmp_path):
    """The same first turn with other tools renders another prefix: another group."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    rows = [
        {"messages": turns(1, 0), "tools": [tool]},
        {"messages": turns(2, 0)},
        {"messages": turns(1, 1)},  # conversation 1 without the tools: not the first row's group
        {"messages": [*turns(1, 0), {"role": "assistant", "content": "other"}, {"role": "user", "content": "more"}]},
    ]
    grouped = run(write(tmp_path / "src.jsonl", rows), tmp_path / "out.jsonl", "--group-prefixes")
    shape = [(len(r["messages"]), "tools" in r) for r in grouped]
    assert shape == [(1, True), (1, False), (3, False), (3, False)]


def test_a_failed_grouped_write_leaves_the_old_output_and_no_temporary_file(tmp_path, monkeypatch):
    """The grouped copy fails: the old output stays, neither temporary file is left."""
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    src = write(tmp_path / "src.jsonl", [{"messages": turns(c, 1)} for c in range(3)])

    def broken(self: Any, src: Any, dst: Any) -> None:
        dst.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_view.PrefixGroups, "copy", broken)
    with pytest.raises(OutputError, match="No space left"):
        prepare_view.prepare(prepare_view.PrepareConfig(inputs=(str(src),), out=out, group_prefixes=True))
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "src.jsonl"]
