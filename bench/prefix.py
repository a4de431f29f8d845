"""Prefix-cache benchmark: prefill paid, tokens/s and client CPU of gen-pipeline, sglang-router (cache_aware) and a
bare round-robin script on the same simulated fleet with SGLang's radix cache.

    python bench/prefix.py [--quick] [--workloads a,b,c] [--caches 200000,16000] [--clients ...] [--busy N]

Fleet: 8 ports x --max-running 16, 8 ms per output token, 100 ms per 1k prefilled prompt tokens, a radix cache
of --caches tokens per port (the simulator's --prefix-cache-tokens, also its KV pool); every row asks 128
tokens and decodes all of them. Workloads (--quick: an eighth):
  a  2,000 prompts x 8 samples (gen-pipeline: --samples 8, one request with n=8; the others: 8 requests)
  b  8,000 prompts sharing 20 long system prompts (2-4k tokens), one short question each
  c  2,000 conversations of 4 user turns as 4 rows each (row k: the first k turns, earlier answers given),
     shuffled
On (c), `gen-pipeline+group` is gen-pipeline after `prepare --group-prefixes` (a conversation's rows together,
the longest first), prepare's CPU counted in its own; the file as shuffled is the `gen-pipeline` row.
Best possible prefill: every distinct prompt token once (the token trie of all prompts), plus one token per
prompt the trie already held in full (SGLang computes a prompt's last token). It is a bound for one server
with an unbounded cache: a fleet that must spread a shared prefix over several servers pays it once each.
Ideal tokens/s: the decode work each client's requests asked for plus the best prefill, every slot busy from
the first request to the last reply. Client CPU: the client's process (gen-pipeline's subprocess, or this
process for the bare script, the router's subprocess added) per row. `--busy N` runs N busy-looping processes
beside each client (other work on the machine: the issue's client that could not feed the fleet when its cores
were shared); the simulator shares the cores with them too, so its own model runs late by the same measure for
every client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from balance import bare_client, cpu_seconds, gateway
from simfleet import ENV, sim_run

from gen_pipeline.sim import free_ports
from gen_pipeline.sim.radix import RadixCache
from gen_pipeline.tokens import TINY_TOKENIZER, load_counter
from gen_pipeline.tokens.counter import FastTokenCounter

WORDS = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "oscar", "sierra", "tango", "river", "stone")
MAX_TOKENS = 128
SAMPLES = 8
PORTS = 8
CLIENTS = ("gen-pipeline", "gen-pipeline+group", "router", "round-robin")
GROUPED = "gen-pipeline+group"  # `prepare --group-prefixes` first, its CPU counted: only where it reorders (c)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload_a(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{"id": i, "messages": [{"role": "user", "content": f"Q{i}: {words(rng, rng.randint(20, 300))}"}]}
            for i in range(n)]  # fmt: skip


def workload_b(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """`n` questions under 20 system prompts of 2-4k tokens (the tiny tokenizer: ~1 token a short word)."""
    systems = [f"System {k}: " + words(rng, rng.randint(550, 1100)) for k in range(20)]
    return [{"id": i, "messages": [{"role": "system", "content": rng.choice(systems)},
                                   {"role": "user", "content": f"Q{i}: {words(rng, rng.randint(10, 60))}"}]}
            for i in range(n)]  # fmt: skip


def workload_c(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """`n` conversations of 4 turns, as 4 rows each (row k: turns 1..k, the answers before k given), shuffled."""
    rows = []
    for c in range(n):
        messages: list[dict[str, str]] = []
        for k in range(4):
            messages.append({"role": "user", "content": f"C{c} turn {k}: {words(rng, rng.randint(20, 120))}"})
            rows.append({"id": f"{c}-{k}", "messages": list(messages)})
            messages.append({"role": "assistant", "content": words(rng, rng.randint(40, 160))})
    rng.shuffle(rows)
    return rows


WORKLOADS = {"a": (workload_a, 2000), "b": (workload_b, 8000), "c": (workload_c, 2000)}


def best_prefill(rows: list[dict[str, Any]]) -> int:
    """Distinct prompt tokens (a trie of every prompt), plus one per prompt the trie held in full."""
    counter = load_counter(str(TINY_TOKENIZER))
    assert isinstance(counter, FastTokenCounter)
    trie, again = RadixCache(10**12), 0
    for row in rows:
        ids = counter.tokenizer.encode(counter.template.render(row["messages"]), add_special_tokens=False).ids
        again += trie.match(ids) == len(ids)
        trie.insert(ids)
    return trie.tokens + again


@dataclass
class Run:
    prefill: int
    cached_share: float
    tokens_per_s: float
    of_ideal: float
    cpu_ms_per_row: float
    note: str


def run_generate(inp: Path, ports: list[int], out: Path, samples: int, group: bool = False) -> tuple[str, float]:
    """gen-pipeline on the fleet (`group`: the input through `prepare --group-prefixes` first); its exactness
    note and its CPU seconds, prepare's included."""
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    before = cpu_seconds()
    if group:
        prepared = inp.with_name(inp.stem + ".grouped.jsonl")
        cmd = [sys.executable, "-m", "gen_pipeline", "prepare", "--input", str(inp), "--out", str(prepared),
               "--group-prefixes"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, env=ENV)
        inp = prepared
    cmd = [sys.executable, "-m", "gen_pipeline", "generate", "--input", str(inp), "--out", str(out),
           "--servers", servers, "--max-tokens", str(MAX_TOKENS), "--progress", "off"]  # fmt: skip
    if samples > 1:
        cmd += ["--samples", str(samples)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    cpu = cpu_seconds() - before
    if done.returncode != 0:
        raise SystemExit(f"generate failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    drift = summary.get("token_drift", {}).get("differed")
    scattered = any("--group-prefixes" in w for w in summary.get("warnings") or [])
    note = f"completed {summary['completed']} drift {drift} ledger {summary.get('ledger_reasons') or {}}"
    return note + (" (warned: rows that begin alike came far apart)" if scattered else ""), cpu


def measure(client: str, rows: list[dict[str, Any]], samples: int, cache: int, tmp: Path, args: Any) -> Run:
    """One client against a fresh fleet; figures from the simulator's own counters."""
    ports = free_ports(PORTS)
    flags = ["--max-running", "16", "--token-latency", str(args.token_latency), "--prompt-token-latency",
             str(args.prompt_token_latency), "--completion-words", "100000", "--context-length", "32768",
             "--light-template", "--seed", "1", "--prefix-cache-tokens", str(cache),
             "--max-total-tokens", str(max(cache, 40000))]  # fmt: skip
    inp = tmp / "rows.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    bare = [{**r, "id": f"{r['id']}/{s}", "max_tokens": MAX_TOKENS} for r in rows for s in range(samples)]
    with sim_run(ports, *flags) as sim, busy_loops(args.busy):
        note = ""
        if client in ("gen-pipeline", GROUPED):
            out = tmp / f"out-{args.workload}-{cache}-{client}"
            note, cpu = run_generate(inp, ports, out, samples, group=client == GROUPED)
        else:
            before = cpu_seconds()
            if client == "router":
                with gateway(ports) as url:
                    asyncio.run(bare_client(bare, [url], PORTS * 16 * 8))
            else:
                asyncio.run(bare_client(bare, urls, PORTS * 16 * 8))
            cpu = cpu_seconds() - before
    stats = sim.port_stats()
    total = {k: sum(s.get(k) or 0 for s in stats.values()) for k in ("prefill_tokens", "prompt_tokens",
             "cached_tokens", "output_tokens", "model_s")}  # fmt: skip
    span = max(s["last_reply_at"] or 0 for s in stats.values()) - min(
        s["first_request_at"] or 1e18 for s in stats.values()
    )
    best = args.best
    ideal_span = (total["model_s"] - (total["prefill_tokens"] - best) * args.prompt_token_latency) / (PORTS * 16)
    return Run(
        int(total["prefill_tokens"]),
        total["cached_tokens"] / max(1, total["prompt_tokens"]),
        total["output_tokens"] / span,
        ideal_span / span,
        cpu * 1000 / len(bare),
        note,
    )


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """`n` processes that spin on a CPU each while the block runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="an eighth of each workload")
    ap.add_argument("--workloads", default="a,b,c")
    ap.add_argument("--caches", default="200000,16000")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--token-latency", type=float, default=0.008)
    ap.add_argument("--prompt-token-latency", type=float, default=0.0001)
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes beside each client")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-prefix-"))
    for name in args.workloads.split(","):
        make, size = WORKLOADS[name]
        rows = make(size // 8 if args.quick else size, random.Random(7))
        samples = SAMPLES if name == "a" else 1
        args.best, args.workload = best_prefill(rows), name
        print(f"\nworkload {name}: {len(rows)} rows x {samples} samples, best possible prefill {args.best:,} tokens")
        print(f"{'cache':>7} {'client':<19}{'prefill':>11}{'x best':>8}{'cached':>8}{'tokens/s':>10}{'of ideal':>9}"
              f"{'cpu ms/row':>11}  exactness")  # fmt: skip
        for cache in map(int, args.caches.split(",")):
            for client in args.clients.split(","):
                if client == GROUPED and name != "c":
                    continue  # (a): one message a row; (b): rows differ at their first user turn: order unchanged
                r = measure(client, rows, samples, cache, tmp, args)
                head = f"{cache:>7} {client:<19}{r.prefill:>11,}{r.prefill / args.best:>8.2f}{r.cached_share:>8.1%}"
                tail = f"{r.tokens_per_s:>10,.0f}{r.of_ideal:>9.1%}{r.cpu_ms_per_row:>11.2f}  {r.note}"
                print(head + tail, flush=True)


if __name__ == "__main__":
    main()
