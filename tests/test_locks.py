"""The run directory's locks: one owner per directory, one writer per shard, and probes that name them."""

from __future__ import annotations

import os
import threading

import pytest
from procs import old_worker_lock

from gen_pipeline.errors import ConfigError
from gen_pipeline.rundir.locks import DirLock, is_held, refuse_shard_writers, shard_writers


def test_is_held_tells_held_free_and_missing_apart(tmp_path):
    """A probe says held while a lock is taken, free after, and None where no lock file exists."""
    lock = DirLock(tmp_path)
    assert is_held(lock.path) is None
    lock.acquire()
    assert is_held(lock.path) is True
    lock.release()
    assert is_held(lock.path) is False


def test_a_probe_never_makes_a_writer_fail(tmp_path):
    """A probe holds a lock for an instant; acquire waits that out instead of refusing."""
    lock = DirLock(tmp_path)
    lock.acquire()
    lock.release()
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            is_held(lock.path)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(200):
            lock.acquire()
            lock.release()
    finally:
        stop.set()
        prober.join(timeout=10)


def test_refuse_shard_writers_names_every_live_worker(tmp_path):
    """A run refuses a directory where an older version's static workers still write, naming each; with
    none it goes ahead."""
    refuse_shard_writers(tmp_path, wait=0)
    held = [old_worker_lock(tmp_path, i, 3) for i in (0, 2)]
    for lock in held:
        lock.acquire()
    try:
        assert [w.split(" on ")[0] for w in shard_writers(tmp_path)] == [
            f"pid {os.getpid()} (shard 0/3)",
            f"pid {os.getpid()} (shard 2/3)",
        ]
        with pytest.raises(ConfigError, match="still being written by a worker of an earlier run") as info:
            refuse_shard_writers(tmp_path, wait=0)
        assert "\n" not in str(info.value)
    finally:
        for lock in held:
            lock.release()
    refuse_shard_writers(tmp_path, wait=0)
