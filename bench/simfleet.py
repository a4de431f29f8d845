"""The simulated fleet as a separate process, for the benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

ENV = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}


@contextlib.contextmanager
def sim_process(ports: list[int], *flags: str) -> Iterator[subprocess.Popen[str]]:
    """`gen-pipeline simulate` on `ports` (health at once) with extra flags; stopped on exit."""
    cmd = [sys.executable, "-m", "gen_pipeline", "simulate", "--ports", ",".join(map(str, ports)),
           "--health-delay", "0", *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        if not any("simulator ready" in line for line in proc.stdout):
            raise SystemExit(f"simulator failed to start: {proc.wait()}")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
