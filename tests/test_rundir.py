"""RunDir: every file name of a run directory comes from one place."""

from __future__ import annotations

from pathlib import Path

from gen_pipeline.rundir.layout import RunDir, write_json_atomic


def test_the_single_writer_has_the_plain_names_and_old_workers_are_named_by_number(tmp_path: Path) -> None:
    """The single writer writes completions.jsonl and its siblings; an older version's static worker 3 left
    status-00003.json, summary-00003.json and .lock-00003, which are only ever read."""
    run = RunDir(tmp_path)
    single, third = run.writer(), run.old_worker(3)
    assert [p.name for p in (single.completions, single.failures, single.status, single.summary)] == [
        "completions.jsonl",
        "failures.jsonl",
        "status.json",
        "summary.json",
    ]
    assert [p.name for p in (third.status, third.summary)] == ["status-00003.json", "summary-00003.json"]
    assert (single.lock.name, third.lock.name) == (".lock", ".lock-00003")


def test_output_files_are_listed_single_writer_first_then_workers_by_number(tmp_path: Path) -> None:
    """Only files that exist, and only names a writer uses (a stray completions-old.jsonl is not output)."""
    for name in ("completions-00010.jsonl", "completions-00002.jsonl", "completions.jsonl", "completions-old.jsonl"):
        (tmp_path / name).touch()
    (tmp_path / "failures-00002.jsonl").touch()
    run = RunDir(tmp_path)
    assert [p.name for p in run.completion_files()] == [
        "completions.jsonl",
        "completions-00002.jsonl",
        "completions-00010.jsonl",
    ]
    assert [p.name for p in run.failure_files()] == ["failures-00002.jsonl"]


def test_worker_reports_are_found_by_number(tmp_path: Path) -> None:
    """status-KKKKK.json by worker; stale reports include the workers' summaries but never summary.json."""
    run = RunDir(tmp_path)
    for name in ("status-00001.json", "status-00000.json", "summary-00001.json", "summary.json", "status.json"):
        write_json_atomic(tmp_path / name, {})
    assert {w: p.name for w, p in run.worker_status_files().items()} == {0: "status-00000.json", 1: "status-00001.json"}
    assert [p.name for p in run.stale_worker_reports()] == [
        "status-00000.json",
        "status-00001.json",
        "summary-00001.json",
    ]
