"""The simulated fleet as a separate process, for the benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ENV = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}


@contextlib.contextmanager
def sim_process(ports: list[int], *flags: str) -> Iterator[subprocess.Popen[str]]:
    """`gen-pipeline simulate` on `ports` (health at once) with extra flags; stopped on exit."""
    cmd = [sys.executable, "-m", "gen_pipeline", "simulate", "--ports", ",".join(map(str, ports)),
           "--health-delay", "0", *flags]  # fmt: skip
    with server_process(cmd, "simulator ready") as proc:
        yield proc


@dataclass
class SimRun:
    """A simulator process and, once it has stopped, the counters it printed for each port."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def port_stats(self) -> dict[int, dict[str, float | None]]:
        """{port: {counter: value}} from the "port N: key=value ..." lines printed on shutdown."""
        stats: dict[int, dict[str, float | None]] = {}
        for line in self.lines:
            head, _, rest = line.partition(": ")
            if not head.startswith("port ") or "=" not in rest:
                continue
            pairs = (item.split("=", 1) for item in rest.split())
            stats[int(head[5:])] = {k: None if v == "None" else float(v) for k, v in pairs}
        return stats


@contextlib.contextmanager
def sim_run(ports: list[int], *flags: str) -> Iterator[SimRun]:
    """`sim_process` that keeps what the simulator prints on shutdown (its per-port counters)."""
    cmd = [sys.executable, "-m", "gen_pipeline", "simulate", "--ports", ",".join(map(str, ports)),
           "--health-delay", "0", *flags]  # fmt: skip
    lines: list[str] = []
    with server_process(cmd, "simulator ready", lines) as proc:
        run = SimRun(proc, lines)
        yield run


@contextlib.contextmanager
def canned_process(ports: list[int]) -> Iterator[subprocess.Popen[str]]:
    """bench/canned.py on `ports` (one canned reply, no counting); stopped on exit."""
    cmd = [sys.executable, str(Path(__file__).with_name("canned.py")), *map(str, ports)]
    with server_process(cmd, "canned ready") as proc:
        yield proc


@contextlib.contextmanager
def server_process(cmd: list[str], ready: str, tail: list[str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """A server process that prints `ready` once it listens; SIGTERM on exit (what it printed after `ready`
    goes to `tail`)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        if not any(ready in line for line in proc.stdout):
            raise SystemExit(f"{cmd[1]} failed to start: {proc.wait()}")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
        if tail is not None:
            tail.extend((rest or "").splitlines())
