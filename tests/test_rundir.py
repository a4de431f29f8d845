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


def test_a_resume_under_the_other_turns_setting_names_both(tmp_path: Path) -> None:
    """A --turns last resume of a --turns all directory is refused naming both settings (it said 'all' -> None)."""
    import pytest

    from gen_pipeline.errors import ManifestMismatchError
    from gen_pipeline.rundir.store import check_manifest

    check_manifest(tmp_path, {"model": "m", "turns": "all"}, force=False)
    with pytest.raises(ManifestMismatchError, match=r"turns: 'all' -> 'last'"):
        check_manifest(tmp_path, {"model": "m"}, force=False)
    (tmp_path / "manifest.json").unlink()
    check_manifest(tmp_path, {"model": "m"}, force=False)
    with pytest.raises(ManifestMismatchError, match=r"turns: 'last' -> 'all'"):
        check_manifest(tmp_path, {"model": "m", "turns": "all"}, force=False)


def test_an_out_that_is_a_broken_symlink_says_so(tmp_path: Path) -> None:
    """--out a dangling symlink, a symlink loop, or a file: one line saying which (it said "File exists")."""
    import pytest

    from gen_pipeline.errors import OutputError
    from gen_pipeline.rundir.layout import make_dir

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("x")
    cases = {
        "dangling": "a symbolic link to .*nowhere, which does not exist",
        "loop": "a symbolic link that loops",
        "file": "a file, not a directory",
    }
    for name, said in cases.items():
        for out in (tmp_path / name, tmp_path / name / "run"):
            with pytest.raises(OutputError, match=f"cannot create {out}: .*{name} is {said}"):
                make_dir(out)
    (tmp_path / "ok").symlink_to(tmp_path)
    assert make_dir(tmp_path / "ok" / "run").is_dir()


def test_a_json_file_that_cannot_be_written_leaves_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    """A full disk while status.json or summary.json is replaced: OutputError, and its .tmp is gone (it
    stayed, after the run and after its resume); a run holding the directory sweeps ones a kill left."""
    import errno

    import pytest

    from gen_pipeline.errors import OutputError
    from gen_pipeline.rundir.layout import sweep_temporary_files

    def full(self: Path, data: bytes) -> int:
        with self.open("wb") as f:
            f.write(data[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_bytes", full)
        for name in ("status.json", "summary.json"):
            with pytest.raises(OutputError, match="No space left"):
                write_json_atomic(tmp_path / name, {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    for left in ("status.json.123.tmp", "summary.json.9.tmp", "manifest.json.77.tmp"):
        (tmp_path / left).write_text("{")
    (tmp_path / "notes.tmp").write_text("mine")
    sweep_temporary_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp"]
