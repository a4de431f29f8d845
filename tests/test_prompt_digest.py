"""A row's output line ends with the digest of the input row's bytes it was answered from (`row_digest`) and of
the prompt it was sent (`prompt_digest`), digests.py: a resume that reads the input from the top compares the
first without parsing the row or the line, the second without parsing the line when the row's bytes differ;
lines written before them are parsed and digested as they always were (resume/changes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from e2e import read_jsonl, run_sim

from gen_pipeline.digests import prompt_digest
from gen_pipeline.rundir.layout import RunDir


def rows(n: int, edited: dict[int, str] | None = None) -> list[dict[str, Any]]:
    edited = edited or {}
    return [{"id": f"r{i}", "prompt": edited.get(i, f"question {i}: tell me more")} for i in range(n)]


def rewrite(out: Path, change: Any) -> None:
    """Rewrite each completion line through `change(obj) -> obj`, and drop the input cursor (a resume from the
    top, as a claimer's or an edited input's)."""
    for path in RunDir(out).completion_files():
        objs = [change(obj) for obj in read_jsonl(path)]
        path.write_bytes(b"".join(orjson.dumps(obj) + b"\n" for obj in objs))
    for cursor in out.rglob("*.cursor"):
        cursor.unlink()


def test_a_rows_line_ends_with_the_digest_of_the_prompt_it_was_sent(write_jsonl, tmp_path):
    """Each row's line says last which prompt (messages and tools, as sent) it answers."""
    out = tmp_path / "out"
    run_sim(write_jsonl(rows(3)), out)
    for path in RunDir(out).completion_files():
        for obj in read_jsonl(path):
            assert list(obj)[-2:] == ["row_digest", "prompt_digest"]
            assert obj["prompt_digest"] == f"{prompt_digest(obj['messages'], obj.get('tools')):016x}"


def test_a_resume_from_the_top_compares_the_recorded_digest(write_jsonl, tmp_path):
    """The digest on the line is what a resume compares: a line whose digest is not its row's prompt's is
    counted changed, though its messages are the row's."""
    out = tmp_path / "out"
    path = write_jsonl(rows(4))
    run_sim(path, out)
    rewrite(out, lambda obj: {**obj, "row_digest": "0" * 16, "prompt_digest": "0" * 16} if obj["id"] == "r1" else obj)
    again, _ = run_sim(path, out)
    assert again.summary["changed_inputs"] == {"rows": 1, "redone": 0, "first": ["r1"]}
    assert again.summary["requests"] == 0


def test_a_row_answered_from_the_same_bytes_is_not_parsed_again(write_jsonl, tmp_path):
    """The row digest vouches for the prompt: a line whose row digest is its row's is not compared further
    (its prompt digest, here made wrong, is not read); a row only rewritten (same prompt, other bytes) is
    compared by its prompt and is not changed."""
    out = tmp_path / "out"
    path = write_jsonl(rows(4))
    run_sim(path, out)
    rewrite(out, lambda obj: {**obj, "prompt_digest": "0" * 16} if obj["id"] == "r1" else obj)
    again, _ = run_sim(path, out)
    assert "changed_inputs" not in again.summary and again.summary["skipped"] == {"done": 4}
    respaced = tmp_path / "respaced.jsonl"
    respaced.write_bytes(b"".join(orjson.dumps({"prompt": r["prompt"], "id": r["id"]}) + b"\n" for r in rows(4)))
    rewrite(out, lambda obj: obj)
    moved, _ = run_sim(respaced, out)
    assert moved.summary["changed_inputs"] == {"rows": 1, "redone": 0, "first": ["r1"]}  # its prompt digest, wrong


def test_lines_without_the_digest_are_still_compared(write_jsonl, tmp_path):
    """Lines written before the digest was recorded: their messages are digested, a changed row is named."""
    out = tmp_path / "out"
    run_sim(write_jsonl(rows(4)), out)
    rewrite(out, lambda obj: {k: v for k, v in obj.items() if k != "prompt_digest"})
    again, _ = run_sim(write_jsonl(rows(4, {2: "an edited question"})), out)
    assert again.summary["changed_inputs"] == {"rows": 1, "redone": 0, "first": ["r2"]}
    quiet, _ = run_sim(write_jsonl(rows(4, {2: "an edited question"})), out, redo_changed=True)
    assert quiet.summary["changed_inputs"]["redone"] == 1
