"""Balancing benchmark: gen-pipeline vs plain round-robin on a troubled 8-port fleet.

    python bench/balance.py [--prompts 3200] [--token-latency 0.02] [--max-running 8]

The simulated fleet (a separate process) has 8 ports: one 4x slower, one dead, one flaky (fails 20% of
requests with 500/502), the rest healthy, all with per-token latency. It prints, side by side:
  - ideal: the sum of the live servers' capacities, from a measured single healthy port:
    5 healthy + 1 flaky (its failures come back at once, so it is counted at full capacity,
    the stricter choice) + 1/4 for the slow one = 6.25 ports;
  - gen-pipeline: `generate` with its defaults (capacity from /server_info);
  - round-robin: a plain asyncio+aiohttp client, one global semaphore of the same total size,
    round-robin over the ports, a failed request moves on to the next port.
Each is reported as req/s and as a fraction of ideal. Target: gen-pipeline >= 90% of ideal.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simfleet import ENV, sim_process  # noqa: E402

from gen_pipeline.sim import free_ports  # noqa: E402

FLAKY_P = 0.2


def write_prompts(path: Path, n: int) -> list[dict]:
    rows = [{"id": i, "prompt": f"Question {i}: " + "explain this in detail " * (1 + i % 13)} for i in range(n)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def run_generate(inp: Path, servers: str, out: Path) -> float:
    """Run gen-pipeline; return completed requests per second from its summary."""
    cmd = [
        sys.executable,
        "-m",
        "gen_pipeline",
        "generate",
        "--input",
        str(inp),
        "--out",
        str(out),
        "--servers",
        servers,
        "--max-tokens",
        "64",
        "--progress",
        "off",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise SystemExit(f"generate failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    return summary["completed"] / summary["elapsed_s"]


async def round_robin(rows: list[dict], urls: list[str], concurrency: int) -> float:
    """A plain client: global semaphore, round-robin ports, on failure try the next port."""
    ports = itertools.cycle(urls)
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(row: dict) -> None:
            body = orjson.dumps(
                {"model": "sim-model", "messages": [{"role": "user", "content": row["prompt"]}], "max_tokens": 64}
            )
            async with sem:
                for _ in range(20):
                    url = next(ports)
                    try:
                        async with session.post(
                            url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
                        ) as r:
                            await r.read()
                            if r.status == 200:
                                return
                    except aiohttp.ClientError:
                        pass

        start = time.monotonic()
        await asyncio.gather(*(one(r) for r in rows))
        return len(rows) / (time.monotonic() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3200)
    ap.add_argument("--token-latency", type=float, default=0.02)
    ap.add_argument("--max-running", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-balance-"))
    rows = write_prompts(tmp / "prompts.jsonl", args.prompts)

    # 1. one healthy port alone: its capacity in req/s
    single_rows = write_prompts(tmp / "single.jsonl", max(args.prompts // 8, 100))
    [port] = free_ports(1)
    load = ("--token-latency", str(args.token_latency), "--max-running", str(args.max_running))
    with sim_process([port], *load):
        single = run_generate(tmp / "single.jsonl", f"127.0.0.1:{port}", tmp / "single-out")
    ideal = single * (5 + 1 + 1 / 4)

    # 2. the troubled fleet
    ports = free_ports(8)
    faults = ["--dead", str(ports[0]), "--slow", f"{ports[1]}:4", "--flaky", f"{ports[2]}:{FLAKY_P}", "--seed", "1"]
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    with sim_process(ports, *load, *faults):
        ours = run_generate(tmp / "prompts.jsonl", servers, tmp / "fleet-out")
        rr = asyncio.run(round_robin(rows, [f"http://127.0.0.1:{p}" for p in ports], 8 * args.max_running))

    print(
        f"workload: {args.prompts} prompts, max_tokens 64, token latency {args.token_latency}s, "
        f"max_running {args.max_running}/port; single healthy port {single:.1f} req/s "
        f"({len(single_rows)} prompts)"
    )
    print(f"{'client':<16}{'req/s':>10}{'of ideal':>10}")
    print(f"{'ideal':<16}{ideal:>10.1f}{1:>10.0%}")
    print(f"{'gen-pipeline':<16}{ours:>10.1f}{ours / ideal:>10.0%}")
    print(f"{'round-robin':<16}{rr:>10.1f}{rr / ideal:>10.0%}")


if __name__ == "__main__":
    main()
