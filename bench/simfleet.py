"""The simulated fleet as a separate process, for the benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ENV = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}


@contextlib.contextmanager
def sim_process(ports: list[int], *flags: str) -> Iterator[subprocess.Popen[str]]:
    """`gen-pipeline simulate` on `ports` (health at once) with extra flags; stopped on exit."""
    cmd = [sys.executable, "-m", "gen_pipeline", "simulate", "--ports", ",".join(map(str, ports)),
           "--health-delay", "0", *flags]  # fmt: skip
    with server_process(cmd, "simulator ready") as proc:
        yield proc


@contextlib.contextmanager
def canned_process(ports: list[int]) -> Iterator[subprocess.Popen[str]]:
    """bench/canned.py on `ports` (one canned reply, no counting); stopped on exit."""
    cmd = [sys.executable, str(Path(__file__).with_name("canned.py")), *map(str, ports)]
    with server_process(cmd, "canned ready") as proc:
        yield proc


@contextlib.contextmanager
def server_process(cmd: list[str], ready: str) -> Iterator[subprocess.Popen[str]]:
    """A server process that prints `ready` once it listens; SIGTERM on exit."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        if not any(ready in line for line in proc.stdout):
            raise SystemExit(f"{cmd[1]} failed to start: {proc.wait()}")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
