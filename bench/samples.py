"""Samples per prompt: one request with n vs one request per sample on the same server.

    python bench/samples.py [--prompts 400] [--samples 4] [--ports 8] [--prefill-latency 0.05]

An in-process simulated fleet with a prefix cache (each port keeps its last 100,000 prompts) charges
`--prefill-latency` once per prompt it has not seen and `--token-latency` per generated word. For each
dispatch it prints the wall time, the requests the servers answered, the prefills they computed (the
prompt paid), and the completion lines written. `requests (no cache)` repeats `--samples-via requests`
on a fleet without a prefix cache: what the same-server rule buys is the prefills it saves there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gen_pipeline.config import RetryPolicy, RunConfig  # noqa: E402
from gen_pipeline.modes import run_async  # noqa: E402
from gen_pipeline.sim import SimConfig, free_ports, start_fleet  # noqa: E402


def write_prompts(path: Path, n: int) -> None:
    """`n` distinct prompts of 20-120 words."""
    with path.open("wb") as f:
        for i in range(n):
            words = "explain the river and the valley " * (4 + i % 20)
            f.write(orjson.dumps({"id": i, "prompt": f"Q{i}: {words}"}) + b"\n")


async def one(args: argparse.Namespace, prompts: Path, out: Path, via: str, cache: int) -> dict[str, float]:
    """One run; its figures."""
    sim = SimConfig(
        ports=tuple(free_ports(args.ports)),
        health_delay=0.0,
        prefill_latency=args.prefill_latency,
        token_latency=args.token_latency,
        max_running=args.max_running,
        prefix_cache=cache,
        completion_words=48,
    )
    async with await start_fleet(sim) as fleet:
        cfg = RunConfig(
            input=prompts, out=out, servers=tuple(fleet.urls), samples=args.samples, samples_via=via,
            max_tokens=64, retry=RetryPolicy.testing(), progress="off",
        )  # fmt: skip
        started = time.monotonic()
        outcome = await run_async(cfg)
        wall = time.monotonic() - started
        stats = fleet.stats.values()
        return {
            "wall_s": round(wall, 2),
            "requests": sum(s.requests for s in stats),
            "prefills": sum(s.prefills for s in stats),
            "lines": outcome.summary["completed"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--ports", type=int, default=8)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--prefill-latency", type=float, default=0.05)
    parser.add_argument("--token-latency", type=float, default=0.001)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        write_prompts(prompts, args.prompts)
        for name, via, cache in (
            ("n", "n", 100_000),
            ("requests", "requests", 100_000),
            ("requests (no cache)", "requests", 0),
        ):
            figures = asyncio.run(one(args, prompts, Path(tmp) / name.replace(" ", "_"), via, cache))
            print(f"{name:>20}: " + "  ".join(f"{k} {v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
