#!/usr/bin/env python3
"""Start and stop one real SGLang server on CPU on 127.0.0.1 (for the realserver tests).

    serve.py start --python VENV_PYTHON --model DIR --port P --dir RUN_DIR [--context-length 2048]
                   [--timeout 600] [-- EXTRA SGLANG FLAGS]
    serve.py stop --dir RUN_DIR

`start` launches `python -m sglang.launch_server` in its own session (output to RUN_DIR/sglang-<port>.log, pid
in RUN_DIR/sglang-<port>.pid) and waits until `/v1/models` answers 200 (40-110 s on 2 busy cores; `/health`
says 503 a little longer, until the warm-up ends). `stop` ends exactly the recorded pids' process groups.
Standard library only; start()/stop() can be imported by pytest fixtures.

The server runs on SGLang's plain-torch CPU path: SGLANG_USE_CPU_ENGINE=1 (without it SGLang does not take
itself to be on a CPU), compat/ first on PYTHONPATH (the sgl_kernel stand-in and the torchvision operator
definitions setup.sh's .pth file loads), a KV pool of 8192 tokens and --enable-cache-report (cached_tokens in
every usage). About 2.8 GB of memory a server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import server_process

HOST = server_process.HOST
MODEL_NAME = "tiny-qwen3"
COMPAT = Path(__file__).resolve().parent / "compat"
MAX_TOTAL_TOKENS = 8192


def start(
    python: str,
    model: Path,
    port: int,
    run_dir: Path,
    context_length: int = 2048,
    extra: Sequence[str] = (),
    timeout: float = 600,
) -> str:
    """Start the server; return its base URL once it answers, or raise RuntimeError with its log's tail."""
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--served-model-name", MODEL_NAME,
            "--host", HOST, "--port", str(port), "--device", "cpu", "--attention-backend", "torch_native",
            "--disable-cuda-graph", "--context-length", str(context_length),
            "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--mem-fraction-static", "0.05",
            "--enable-cache-report", *extra]  # fmt: skip
    path = os.pathsep.join(p for p in (str(COMPAT), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return server_process.start("sglang", argv, env, port, run_dir, timeout)


def stop(run_dir: Path, timeout: float = 20) -> None:
    """SIGTERM each recorded server's process group, SIGKILL after `timeout`; remove the pid files."""
    server_process.stop("sglang", run_dir, timeout)


def main(argv: list[str]) -> int:
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--python", required=True)
    s.add_argument("--model", type=Path, required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--context-length", type=int, default=2048)
    s.add_argument("--timeout", type=float, default=600)
    t = sub.add_parser("stop")
    t.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(ours)
    if args.cmd == "stop":
        stop(args.dir)
        return 0
    print(start(args.python, args.model, args.port, args.dir, args.context_length, extra, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
