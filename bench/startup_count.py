"""What counting the input beside the run (engine/workload.py, the progress bar's total) costs at start-up.

    .venv/bin/python bench/startup_count.py [--rows 650000] [--turns last|all] [--repeats 3]

Writes a prompts file of --rows rows (conversations of three user turns under --turns all), starts a
simulated fleet of 8 servers, and times `gen-pipeline generate` from its launch to the first completion
line on disk, with the count and with it switched off (start_count replaced by a no-op in the process),
alternating; then how long the count itself takes. Each run is stopped (SIGINT) after its first line.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from gen_pipeline.config import RunConfig
from gen_pipeline.engine.workload import Tally

REPO = Path(__file__).resolve().parents[1]
PORTS = "31700-31707"
# The generate command, in-process so the count can be switched off for the comparison.
RUNNER = """
import sys
if sys.argv[1] == "off":
    import gen_pipeline.engine.reader as reader
    reader.start_count = lambda *a, **k: None
from gen_pipeline.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


def write_input(path: Path, rows: int, turns: str) -> None:
    """`rows` rows of 100-300 characters (a conversation of three user turns each under --turns all)."""
    with path.open("wb") as f:
        for i in range(rows):
            text = f"Question {i}: " + "tell me more about it " * (4 + i % 10)
            if turns == "all":
                turns_ = [{"role": r, "content": f"{text} {t}"} for t in range(3) for r in ("user", "assistant")]
                row = {"id": i, "messages": turns_[:-1]}
            else:
                row = {"id": i, "messages": [{"role": "user", "content": text}]}
            f.write(orjson.dumps(row) + b"\n")


def first_line_after(count: str, inp: Path, out: Path, turns: str) -> float:
    """Seconds from launching generate to its first completion line on disk."""
    argv = [sys.executable, "-c", RUNNER, count, "generate", "-i", str(inp), "-o", str(out), "-s", f"127.0.0.1:{PORTS}"]
    argv += ["--turns", turns, "--progress", "off", "--max-tokens", "16"]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = out / "completions.jsonl"
    while not (done.exists() and done.stat().st_size > 0):
        if proc.poll() is not None:
            raise RuntimeError(f"generate exited {proc.returncode} before its first line")
        time.sleep(0.005)
    took = time.monotonic() - start
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=650_000)
    ap.add_argument("--turns", choices=["last", "all"], default="last")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.jsonl"
        write_input(inp, args.rows, args.turns)
        print(f"input: {args.rows:,} rows, {inp.stat().st_size / 1e6:.0f} MB, --turns {args.turns}")
        sim = subprocess.Popen(
            [REPO / ".venv/bin/gen-pipeline", "simulate", "--ports", PORTS, "--health-delay", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
        )
        try:
            assert sim.stdout is not None
            for line in sim.stdout:
                if "simulator ready" in line:
                    break
            times: dict[str, list[float]] = {"on": [], "off": []}
            for i in range(args.repeats):
                for count in ("off", "on") if i % 2 else ("on", "off"):
                    times[count].append(first_line_after(count, inp, Path(tmp) / f"out-{count}-{i}", args.turns))
            for count, seen in times.items():
                shown = ", ".join(f"{t:.2f}" for t in seen)
                print(f"first line, count {count:>3}: median {statistics.median(seen):.2f} s ({shown})")
        finally:
            sim.send_signal(signal.SIGTERM)
            sim.wait(30)
        config = RunConfig(input=inp, out=Path(tmp), turns=args.turns)
        start = time.monotonic()
        units = Tally(args.turns == "all", 1, None, 0).count(config, threading.Event())
        print(f"the count alone: {time.monotonic() - start:.2f} s, {units[1] if units else None:,} units")


if __name__ == "__main__":
    main()
