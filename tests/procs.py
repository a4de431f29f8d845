"""Helpers for tests that run gen-pipeline as a user does: as subprocesses."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.rundir.locks import FileLock
from gen_pipeline.sim import free_ports

PY = sys.executable


def old_worker_lock(out: Path, index: int, count: int) -> FileLock:
    """The lock a static worker of an older version held while it wrote completions-KKKKK.jsonl."""
    return FileLock(RunDir(out).old_worker(index).lock, f" (shard {index}/{count})")


def free_port_run(n: int) -> int:
    """A port P such that P .. P+n-1 are free on 127.0.0.1, below the kernel's ephemeral range: no connection
    made meanwhile (each takes an ephemeral local port), nor a port picked by free_ports, can take one of them
    before a process listens there (`--workers K --metrics-port P` listens on P+i)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    for _ in range(100):
        base = random.randrange(10000, low - n)
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise AssertionError(f"no {n} consecutive free ports under {low}")


def env() -> dict[str, str]:
    return {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def sim_fleet(n: int = 4, *args: str) -> Iterator[str]:
    """A simulator subprocess on `n` free ports; yields the --servers value."""
    with sim_fleet_process(n, *args) as (servers, _):
        yield servers


@contextlib.contextmanager
def sim_fleet_process(n: int = 4, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """sim_fleet, also yielding the simulator's process (to pause it with SIGSTOP, say)."""
    ports = free_ports(n)
    spec = f"{ports[0]}" if n == 1 else ",".join(map(str, ports))
    drain = None
    proc = subprocess.Popen(
        [PY, "-m", "gen_pipeline", "simulate", "--ports", spec, "--health-delay", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env(),
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            if "simulator ready" in line:
                break
            assert time.monotonic() < deadline, "simulator did not start"
        else:
            raise AssertionError(f"simulator exited with {proc.wait()}")
        # Read what it prints from now on: a pipe nobody reads fills (64 KiB), and the simulator then blocks in
        # its next log line (a traceback for each client that leaves a streamed answer), answering nothing.
        drain = threading.Thread(target=proc.stdout.read, daemon=True)
        drain.start()
        yield ",".join(f"127.0.0.1:{p}" for p in ports), proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)  # a paused one would not see the SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if drain is not None:
            drain.join(timeout=15)  # at the end of the output, now that the simulator is gone
        if proc.stdout is not None:
            proc.stdout.close()


def generate_argv(inp: Path, out: Path, servers: str, *args: str, progress: str = "log") -> list[str]:
    """The command line of `gen-pipeline generate` over `inp` into `out`."""
    return [PY, "-m", "gen_pipeline", "generate", "--input", str(inp), "--out", str(out),
            "--servers", servers, "--progress", progress, *args]  # fmt: skip


def generate(inp: Path, out: Path, servers: str, *args: str) -> subprocess.Popen[str]:
    """Start `gen-pipeline generate` as a subprocess."""
    argv = generate_argv(inp, out, servers, *args)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), text=True)


def run_generate(
    inp: Path, out: Path, servers: str, *args: str, timeout: float = 180, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run `gen-pipeline generate` to the end (no progress output) and return its result."""
    argv = generate_argv(inp, out, servers, *args, progress="off")
    return subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=timeout, **kw)


def wait_for_lines(path: Path, n: int, timeout: float) -> None:
    """Block until `path` holds at least `n` lines (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)


def children(pid: int, n: int, timeout: float) -> list[int]:
    """Block until process `pid` has `n` children (Linux /proc); return their pids."""
    deadline = time.monotonic() + timeout
    found: list[int] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            found = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        if len(found) >= n:
            return found
        time.sleep(0.02)
    raise AssertionError(f"process {pid} has {len(found)} children, not {n}")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of `pids` runs; the ones still running when the timeout passes."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def kill_all(pids: list[int]) -> None:
    """SIGCONT then SIGKILL each pid still there (cleanup after a test that failed)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def wait_for_done(out: Path, n: int, timeout: float) -> None:
    """Block until the run's output files (every shard's) hold at least `n` lines (or the timeout passes)."""
    from gen_pipeline.rundir.layout import RunDir

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(p.read_bytes().count(b"\n") for p in RunDir(out).completion_files()) >= n:
            return
        time.sleep(0.02)
