"""What following each server's own load buys: gen-pipeline with its load watcher (the default) beside the same
client held at its start-up figure, on a fleet whose KV pools, not their running slots, decide how many run.

    python bench/loads.py [--rows 2000] [--ports 4] [--slow 3]

Fleet: --ports simulated SGLang servers (`--kv-admission`: a request runs only while its prompt plus its
max_tokens fit in the KV pool beside the running ones, as SGLang 0.5.23 admits them), 64 running slots and a
pool of 24,000 tokens each, 8 ms per output token; the first port --slow times slower. Rows: prompts of ~450-900
tokens asking 128 tokens each, so a pool runs ~25 at once while the start-up figure (slots capped by pool //
max_tokens) is 64: every server is sent 64 + a queue margin of 8, and ~45 of them wait in its own queue.
Clients (a fresh fleet each):
  follows load   `generate` as it is: capacity and queue margin follow each server's /v1/loads.
  start figure   `generate --concurrency 64 --queue-margin 8`: the same start-up figure, never moved.
Printed: the span (first request to last reply over the fleet), completed tokens/s, the tail (last request sent
to last reply, as the client saw it), the most requests each server held at once against the most it ran (the
rest waited in its own queue, committed to it), and the rows the slow port answered. Requests queued at a slow
server cannot be taken back: its queue, not the client, sets when the run ends.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from balance import run_generate
from prefix import WORDS
from simfleet import sim_run

from gen_pipeline.sim import free_ports

MAX_TOKENS = 128
SLOTS, POOL = 64, 24_000
CLIENTS = {"follows load": [], "start figure": ["--concurrency", "64", "--queue-margin", "8"]}


def rows(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """`n` one-message prompts of ~450-900 tokens (the tiny tokenizer: about 2.5 tokens a word), 128 out each."""

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(180, 360)))

    return [{"id": i, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": text()}]} for i in range(n)]


def measure(extra: list[str], inp: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One client on a fresh fleet: the simulator's counters and the client's tail."""
    ports = free_ports(args.ports)
    flags = ["--max-running", str(SLOTS), "--max-total-tokens", str(POOL), "--kv-admission", "--token-latency",
             "0.008", "--prompt-token-latency", "0.00002", "--completion-words", "100000", "--context-length",
             "8192", "--light-template", "--seed", "1", "--slow", f"{ports[0]}:{args.slow}"]  # fmt: skip
    with sim_run(ports, *flags) as sim:
        tail, _ = run_generate(inp, ports, out, ["--max-tokens", str(MAX_TOKENS), *extra])
    stats = [sim.port_stats()[p] for p in ports]
    first = min(s["first_request_at"] or 1e18 for s in stats)
    span = max(s["last_reply_at"] or 0 for s in stats) - first
    return {
        "span": span,
        "tokens_s": sum(s["output_tokens"] or 0 for s in stats) / span,
        "tail": tail,
        "held": [int(s["max_in_flight"] or 0) for s in stats],
        "ran": [int(s["max_running"] or 0) for s in stats],
        "slow_rows": int(stats[0]["completions"] or 0),
        "capacity": [v["capacity"] for v in orjson.loads((out / "summary.json").read_bytes())["servers"].values()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--ports", type=int, default=4)
    ap.add_argument("--slow", type=float, default=3.0, help="the first port's slowness factor")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-loads-"))
    inp = tmp / "rows.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows(args.rows, random.Random(7))))
    print(f"{args.rows} rows, {args.ports} ports (the first {args.slow:g}x slow), {SLOTS} slots and a KV pool of "
          f"{POOL:,} tokens each (KV admission)")  # fmt: skip
    print(f"{'client':<14}{'span s':>8}{'tokens/s':>10}{'tail s':>8}  {'held at once / ran at once, per port':<40}"
          f"{'slow port rows':>15}  capacity at the end")  # fmt: skip
    for name, extra in CLIENTS.items():
        r = measure(extra, inp, tmp / name.replace(" ", "-"), args)
        held = " ".join(f"{h}/{n}" for h, n in zip(r["held"], r["ran"], strict=True))
        tail = f"{r['tail']:.1f}" if r["tail"] is not None else "-"
        print(f"{name:<14}{r['span']:>8.1f}{r['tokens_s']:>10,.0f}{tail:>8}  {held:<40}{r['slow_rows']:>15}  "
              f"{r['capacity']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
