#!/usr/bin/env python3
"""Start and stop one real vLLM OpenAI server on CPU on 127.0.0.1 (for the realserver tests).

    serve.py start --python VENV_PYTHON --model DIR --port P --dir RUN_DIR [--max-model-len 2048] [--timeout 600]
    serve.py stop --dir RUN_DIR

`start` launches `python -m vllm.entrypoints.openai.api_server` in its own session (output to
RUN_DIR/vllm-<port>.log, pid in RUN_DIR/vllm-<port>.pid) and waits until `/v1/models` answers 200
(about 2.5 minutes on 2 busy cores: the compile warm-up). `stop` ends exactly the recorded pid's process
group. Standard library only; start()/stop() can be imported by pytest fixtures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
MODEL_NAME = "tiny-qwen3"
# Popen handles of the servers this process started: kept so they are reaped, not left to warn when collected.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


# Requests with `tools` need a tool-call parser (vLLM refuses tool_choice "auto" without one); Qwen3's is hermes.
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def start(python: str, model: Path, port: int, run_dir: Path, max_model_len: int = 2048, timeout: float = 600) -> str:
    """Start the server; return its base URL once it answers, or raise RuntimeError with its log's tail."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"vllm-{port}.log"
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", HOST,
            "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "bfloat16",
            "--served-model-name", MODEL_NAME, "--no-enable-log-requests", *TOOL_ARGS]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    _CHILDREN[proc.pid] = proc
    (run_dir / f"vllm-{port}.pid").write_text(f"{proc.pid}\n")
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
                if resp.status == 200:
                    return url
        time.sleep(2)
    stop(run_dir)
    raise RuntimeError(f"vLLM not ready after {timeout:.0f} s:\n{_tail(log)}")


def stop(run_dir: Path, timeout: float = 20) -> None:
    """SIGTERM each recorded server's process group, SIGKILL after `timeout`; remove the pid files."""
    for pid_file in run_dir.glob("vllm-*.pid"):
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


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--python", required=True)
    s.add_argument("--model", type=Path, required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--max-model-len", type=int, default=2048)
    s.add_argument("--timeout", type=float, default=600)
    t = sub.add_parser("stop")
    t.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    if args.cmd == "stop":
        stop(args.dir)
        return 0
    print(start(args.python, args.model, args.port, args.dir, args.max_model_len, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
