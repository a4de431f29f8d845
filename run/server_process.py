"""Start, wait for and stop one real server process on 127.0.0.1, for the realserver tests (vllm/serve.py and
sglang/serve.py; standard library only).

A server runs in its own session with its output in RUN_DIR/<name>-<port>.log and its pid in
RUN_DIR/<name>-<port>.pid; `stop` ends exactly the recorded pids' process groups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

HOST = "127.0.0.1"
# Popen handles of the servers this process started: kept so they are reaped, not left to warn when collected.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def start(name: str, argv: Sequence[str], env: Mapping[str, str], port: int, run_dir: Path, timeout: float) -> str:
    """Launch `argv` as server `name` on `port`; return its base URL once /v1/models answers 200, or raise
    RuntimeError with its log's tail (the server stopped)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"{name}-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env}, start_new_session=True)  # fmt: skip
    _CHILDREN[proc.pid] = proc
    (run_dir / f"{name}-{port}.pid").write_text(f"{proc.pid}\n")
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail(log)}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp,
        ):
            if resp.status == 200:
                return url
        time.sleep(2)
    stop(name, run_dir)
    raise RuntimeError(f"{name} not ready after {timeout:.0f} s:\n{tail(log)}")


def stop(name: str, run_dir: Path, timeout: float = 20) -> None:
    """SIGTERM each recorded `name` server's process group, SIGKILL after `timeout`; remove the pid files."""
    for pid_file in run_dir.glob(f"{name}-*.pid"):
        pid = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.2)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
        proc = _CHILDREN.pop(pid, None)
        if proc is not None:
            proc.wait(timeout)
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        pid_file.unlink()


def _alive(pid: int) -> bool:
    if pid in _CHILDREN:
        return _CHILDREN[pid].poll() is None
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def tail(log: Path, lines: int = 40) -> str:
    """The last `lines` lines of a server's log."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"
