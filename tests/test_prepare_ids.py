"""prepare keeps the users' ids (issue 53): unique ones as they are, repeated ones made unique the same way on every
run, and a nightly dataset grown from a plain run keeps one id scheme."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import read_jsonl, run_sim

from gen_pipeline.cli import main
from gen_pipeline.records import content_digest, content_id
from gen_pipeline.rundir.layout import RunDir

U = "user"


def row(rid: Any, text: str, **extra: Any) -> dict[str, Any]:
    return {**({"id": rid} if rid is not None else {}), "messages": [{"role": U, "content": text}], **extra}


def prepare(*args: Any) -> int:
    return main(["prepare", *map(str, args)])


def suffix(text: str) -> str:
    """The 8 hex digits prepare appends to an id another row has: the row's content digest."""
    return content_digest([{"role": U, "content": text}]).hex()[:8]


def test_unique_ids_are_kept_and_repeated_ones_made_unique(tmp_path, write_jsonl, capsys):
    """Each row keeps its id; a later row with an id already written and other content gets `<id>-<digest>`, the
    id it had in source_id; the same content again is a duplicate; a row without an id gets its content id."""
    src = write_jsonl(
        [row("q0", "first"), row("q1", "second"), row("q0", "other content"), row("q0", "first"), row(None, "no id")]
    )
    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    assert prepare("--input", src, "--out", out, "--report", report) == 0
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["q0", "q1", f"q0-{suffix('other content')}", content_id(rows[3]["messages"])]
    assert rows[2]["source_id"] == "q0" and "source_id" not in rows[0]
    counts = orjson.loads(report.read_bytes())
    assert (counts["duplicates"], counts["ids_made_unique"], counts["written"]) == (1, 1, 4)
    assert "(1 with an id made unique)" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    prepare("--input", src, "--out", again)
    assert read_jsonl(again) == rows  # the same ids on every run


def test_an_id_an_excluded_dataset_holds_for_other_content_is_made_unique(tmp_path, write_jsonl):
    """--exclude a run directory: its rows' contents are excluded, and its ids are taken: a new row reusing one for
    other content is made unique, never written under the id of another answer."""
    earlier = write_jsonl([row("q0", "old zero"), row("q1", "old one")], "earlier.jsonl")
    run = tmp_path / "run"
    run_sim(earlier, run)
    src = write_jsonl([row("q0", "old zero"), row("q1", "a new question"), row("q2", "another")], "src.jsonl")
    out = tmp_path / "out.jsonl"
    assert prepare("--input", src, "--out", out, "--exclude", run) == 0
    assert [r["id"] for r in read_jsonl(out)] == [f"q1-{suffix('a new question')}", "q2"]


@pytest.mark.slow
def test_a_nightly_dataset_grown_from_a_plain_run_keeps_one_id_scheme(tmp_path, write_jsonl):
    """A plain run with ids q0..q5, then a night whose source reuses q3..q5 for new questions and adds q6..q8: the
    dataset holds the users' ids only (no content hash), each once, the reused ones made unique."""
    from procs import sim_fleet
    from test_nightly import clean_env, nightly

    ds = tmp_path / "ds"
    plain = write_jsonl([row(f"q{i}", f"question {i}") for i in range(6)], "plain.jsonl")
    night = [row(f"q{i}", f"question {i}") for i in range(3)] + [row(f"q{i}", f"new question {i}") for i in range(3, 9)]
    src = write_jsonl(night, "tonight.jsonl")
    with sim_fleet(2) as servers:
        assert (
            main(
                ["generate", "-i", str(plain), "-o", str(ds), "-s", servers, "--max-tokens", "16", "--progress", "off"]
            )
            == 0
        )
        env = clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers)
        done = nightly(
            "--dataset-dir", ds, "--date", "2026-01-01", "--", "--max-tokens", "16", "--progress", "off", env=env
        )
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [r["id"] for p in RunDir(ds).completion_files() for r in read_jsonl(p)]
    assert len(ids) == len(set(ids)) == 12
    assert not [i for i in ids if str(i).startswith("h")]
    reused = {f"q{i}-{suffix(f'new question {i}')}" for i in range(3, 6)}
    assert set(ids) == {f"q{i}" for i in range(9)} | reused
    prompts = read_jsonl(ds / "prompts" / "nightly-2026-01-01.jsonl")
    assert {r["source_id"] for r in prompts if "source_id" in r} == {"q3", "q4", "q5"}


def test_prepare_and_generate_give_an_id_less_row_one_id(tmp_path, write_jsonl):
    """A row without an id has one content id whether generate reads it directly or prepare wrote it first."""
    src = write_jsonl([row(None, "no id here")])
    out = tmp_path / "p.jsonl"
    prepare("--input", src, "--out", out)
    run_sim(src, tmp_path / "direct")
    assert read_jsonl(out)[0]["id"] == read_jsonl(Path(tmp_path / "direct" / "completions.jsonl"))[0]["id"]
