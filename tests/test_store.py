"""The run directory: torn lines, resume sets, the manifest check and the lock."""

from __future__ import annotations

import errno
import os
import threading

import orjson
import pytest

from gen_pipeline.errors import ConfigError, ManifestMismatchError, OutputError
from gen_pipeline.records import Completion, Failure, id_key
from gen_pipeline.resume.settled import scan
from gen_pipeline.rundir.layout import COMPLETIONS, FAILURES
from gen_pipeline.rundir.locks import DirLock
from gen_pipeline.rundir.store import RunWriter, check_manifest, repair_tail


def completion(i) -> Completion:
    return Completion(i, [{"role": "user", "content": "q"}], "a", "stop", 3, 3, 1, 8, "s", 1, 0.1, "m", {})


def test_torn_last_line_moves_aside(tmp_path):
    """A last line without a newline is moved to .torn and never parsed as data."""
    path = tmp_path / COMPLETIONS
    line = completion(1).to_line()
    path.write_bytes(line + b'{"id": 2, "messages": [{"ro')
    assert repair_tail(path) > 0
    assert path.read_bytes() == line
    assert (tmp_path / (COMPLETIONS + ".torn")).read_bytes().startswith(b'{"id": 2')
    assert repair_tail(path) == 0


def test_torn_only_line(tmp_path):
    """A file holding only a torn line becomes empty."""
    path = tmp_path / COMPLETIONS
    path.write_bytes(b'{"id": 1')
    repair_tail(path)
    assert path.read_bytes() == b""


def test_scan_resume_state(tmp_path):
    """Done ids, the newest ledger reason per id, bad lines and corrupt lines are found."""
    (tmp_path / COMPLETIONS).write_bytes(completion(1).to_line() + b"garbage\n" + completion("b").to_line())
    ledger = [
        Failure("x", 3, "timeout", "t"),
        Failure("x", 3, "over_length", "o"),
        Failure("y", 4, "bad_request", "b"),
        Failure("y", 4, "server_error", "s"),
        Failure(None, 9, "bad_input", "bad", source="p.jsonl"),
    ]
    (tmp_path / FAILURES).write_bytes(b"".join(f.to_line() for f in ledger))
    state = scan(tmp_path)
    assert set(state.done) == {id_key(1), id_key("b")}
    assert state.corrupt_lines == [f"{COMPLETIONS}:2"]
    assert state.settled(id_key(1), frozenset()) == "done"
    assert state.settled(id_key("x"), frozenset()) == "over_length"
    assert state.settled(id_key("x"), frozenset({"over_length"})) is None
    assert state.settled(id_key("y"), frozenset()) is None  # newest entry is transient
    assert ("p.jsonl", 9) in state.bad_lines


def test_writer_lines_are_whole_and_flushed(tmp_path):
    """Each write is one complete JSON line, readable before close."""
    writer = RunWriter(tmp_path, fsync_interval=0.0)
    writer.write_completion(completion(1))
    writer.write_failure(Failure(2, 2, "timeout", "slow"))
    assert orjson.loads((tmp_path / COMPLETIONS).read_bytes())["id"] == 1
    assert orjson.loads((tmp_path / FAILURES).read_bytes())["reason"] == "timeout"
    writer.close()


def test_a_slow_fsync_never_holds_up_a_write(tmp_path, monkeypatch):
    """fsync runs in the writer's thread: while a disk holds an fsync, writes still return, every line is in
    the file, and close() waits for the fsync in flight and makes its own."""
    fsynced, disk = [], threading.Event()

    def held_fsync(fd):
        assert disk.wait(10), "the test never released the disk"
        fsynced.append(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    writer = RunWriter(tmp_path, fsync_interval=0.0)
    for i in range(20):  # on the loop, the first write would wait for the held fsync and never return
        writer.write_completion(completion(i))
    assert len((tmp_path / COMPLETIONS).read_bytes().splitlines()) == 20  # flushed before fsync
    assert fsynced == []  # every write returned while the first fsync was still held
    disk.set()
    writer.close()
    assert len(fsynced) == 4  # the one in flight (both files), then close's own


def test_a_failed_background_fsync_fails_the_next_write(tmp_path, monkeypatch):
    """An fsync error in the thread stops the writer at its next fsync turn with an OutputError."""

    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    writer = RunWriter(tmp_path, fsync_interval=0.0)
    writer.write_completion(completion(1))  # starts the fsync that fails
    assert writer._fsyncing is not None
    writer._fsyncing.exception(timeout=10)  # the thread has failed (no sleep: wait for it)
    with pytest.raises(OutputError, match=r"cannot fsync the output .*Input/output error"):
        writer.write_completion(completion(2))
    with pytest.raises(OutputError):  # and nothing more is written
        writer.write_failure(Failure(3, 3, "timeout", "slow"))
    writer.close()  # does not raise
    assert [orjson.loads(x)["id"] for x in (tmp_path / COMPLETIONS).read_bytes().splitlines()] == [1, 2]


def test_manifest_mismatch_refused_unless_forced(tmp_path):
    """Resuming with another model or sampling is refused with a message naming the change."""
    check_manifest(tmp_path, {"model": "a", "sampling": {}}, force=False)
    check_manifest(tmp_path, {"model": "a", "sampling": {}, "servers": ["x"]}, force=False)
    with pytest.raises(ManifestMismatchError, match="model: 'a' -> 'b'"):
        check_manifest(tmp_path, {"model": "b", "sampling": {}}, force=False)
    check_manifest(tmp_path, {"model": "b", "sampling": {}}, force=True)


def test_second_writer_is_refused(tmp_path):
    """A second lock on one directory is refused naming the holder; release frees it."""
    first = DirLock(tmp_path)
    first.acquire()
    with pytest.raises(ConfigError, match="in use by pid"):
        DirLock(tmp_path).acquire()
    first.release()
    again = DirLock(tmp_path)
    again.acquire()
    again.release()


def test_scan_distrusts_damaged_lines_and_reads_foreign_ones_in_full(tmp_path):
    """Lines that do not look like ours are parsed in full; damaged ones are corrupt, never done."""
    good = completion("a").to_line()
    cut = good[: len(good) // 2] + b"\n"  # a line cut in its middle (starts like ours, no closing brace)
    nuls = b"\x00" * 40 + b"\n"  # a block a power loss left unwritten
    foreign = b'{"completion": "x", "id": "c"}\n'  # valid JSON, id not first: parsed in full
    spaced = b'{"id": 7, "completion": "y"}  \n'  # trailing spaces: parsed in full
    broken = b'{"id": "d", "completion": \n'  # starts like a row, then breaks off
    (tmp_path / COMPLETIONS).write_bytes(good + cut + nuls + foreign + spaced + broken)
    state = scan(tmp_path, repair=False)
    assert set(state.done) == {id_key("a"), id_key("c"), id_key(7)}
    assert state.corrupt_lines == [f"{COMPLETIONS}:{n}" for n in (2, 3, 6)]
