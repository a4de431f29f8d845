#!/usr/bin/env python3
"""Start and stop one real vLLM OpenAI server on CPU on 127.0.0.1 (for the realserver tests).

    serve.py start --python VENV_PYTHON --model DIR --port P --dir RUN_DIR [--max-model-len 2048] [--timeout 600]
                   [-- EXTRA VLLM FLAGS]
    serve.py stop --dir RUN_DIR

`start` launches `python -m vllm.entrypoints.openai.api_server` in its own session (output to
RUN_DIR/vllm-<port>.log, pid in RUN_DIR/vllm-<port>.pid) and waits until `/v1/models` answers 200
(about 2.5 minutes on 2 busy cores: the compile warm-up). `stop` ends exactly the recorded pid's process
group. Standard library only; start()/stop() can be imported by pytest fixtures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import server_process

HOST = server_process.HOST
MODEL_NAME = "tiny-qwen3"
# Requests with `tools` need a tool-call parser (vLLM refuses tool_choice "auto" without one); Qwen3's is hermes.
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def start(
    python: str,
    model: Path,
    port: int,
    run_dir: Path,
    max_model_len: int = 2048,
    timeout: float = 600,
    extra: Sequence[str] = (),
) -> str:
    """Start the server; return its base URL once it answers, or raise RuntimeError with its log's tail."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", HOST,
            "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "bfloat16",
            "--served-model-name", MODEL_NAME, "--no-enable-log-requests", *TOOL_ARGS, *extra]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return server_process.start("vllm", argv, env, port, run_dir, timeout)


def stop(run_dir: Path, timeout: float = 20) -> None:
    """SIGTERM each recorded server's process group, SIGKILL after `timeout`; remove the pid files."""
    server_process.stop("vllm", run_dir, timeout)


def main(argv: list[str]) -> int:
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
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
    args = parser.parse_args(ours)
    if args.cmd == "stop":
        stop(args.dir)
        return 0
    print(start(args.python, args.model, args.port, args.dir, args.max_model_len, args.timeout, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
