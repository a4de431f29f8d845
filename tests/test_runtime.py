"""Process-level pieces: standard streams that never raise (the stop signals: tests/test_stops.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from gen_pipeline.runtime import QuietStream, say
from gen_pipeline.sim import free_ports


def test_a_stream_whose_reader_is_gone_never_raises():
    """Writes to a pipe with no reader are dropped: no BrokenPipeError, now or at the next flush."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    raw = os.fdopen(write_end, "w")
    quiet = QuietStream(raw)  # type: ignore[arg-type]
    quiet.write("x\n" * 10_000)
    quiet.flush()
    assert quiet.broken
    quiet.write("more\n")
    say("one line", quiet)  # type: ignore[arg-type]
    raw.write("after\n")
    raw.flush()  # the descriptor now leads to /dev/null
    raw.close()


def wait_for_port(port: int, timeout: float) -> None:
    """Block until something listens on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def gen_pipeline_argv(*args: str) -> list[str]:
    """The `gen-pipeline` command as a user runs it, with this interpreter."""
    return [sys.executable, "-m", "gen_pipeline", *args]


def test_a_process_whose_supervisor_is_already_gone_stops_at_once():
    """The supervisor died before the child could bind itself to it (the gap setpriv leaves): the child
    sees it has another parent and stops with one line instead of running on unsupervised."""
    env = {**os.environ, "GEN_PIPELINE_SUPERVISOR_PID": str(os.getpid() + 1_000_000)}
    done = subprocess.run(
        gen_pipeline_argv("simulate", "--ports", "1"), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130, done.stderr
    assert "is gone; stopping" in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_supervised_process_dies_with_its_supervisor_killed_by_sigkill(tmp_path):
    """kill -9 of a shell that started gen-pipeline as its supervised child (no setpriv): the child dies
    too, by the parent-death signal it set itself."""
    from procs import children, wait_gone

    (port,) = free_ports(1)
    script = f"GEN_PIPELINE_SUPERVISOR_PID=$$ {' '.join(gen_pipeline_argv('simulate', '--ports', str(port)))} & wait"
    shell = subprocess.Popen(["bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (child,) = children(shell.pid, 1, timeout=30)
        wait_for_port(port, timeout=60)
        shell.kill()
        shell.wait(timeout=10)
        assert wait_gone([child], timeout=10) == [], "the child ran on after its supervisor was killed"
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
        shell.wait(timeout=10)
