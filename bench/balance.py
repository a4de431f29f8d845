"""Balancing benchmark: gen-pipeline, round-robin and the SGLang gateway side by side on the same fleets.

    python bench/balance.py [--prompts 7000] [--fleets A,B] [--clients gen-pipeline,round-robin,gateway]

Latency model (the simulator's): a request holds one of its port's --max-running 16 slots for
8 ms per output token + 20 ms per 1k prompt tokens (x4 on a slow port); 502s on arrival hold none. At this
pace a 2-core machine keeps up (the "sim late" column); 7,000 prompts make runs of 2-3 minutes, long enough
that the drain at the end costs under 2%; the whole benchmark takes about 15 minutes.
Workload: chat prompts of ~20-1,500 prompt tokens, each row with its own max_tokens in 64-512; the simulated
completions are longer, so every request decodes exactly its max_tokens.
Fleets, 8 ports each:
  A: 8 equal servers.
  B: one 4x slow, one dead, one answering 30% of requests with an instant 502, five healthy.
  C (when asked: --fleets A,B,C): two 2x slow, one failing half its requests with an instant 500 or 502,
     five healthy.
Ideal: the completed tokens/s the model allows, sum over live ports of slots / slowness x E[out] / E[latency]
(the instant 502s hold no slot, so that port counts in full: the stricter choice). It assumes every slot busy
from the first request to the last reply, which no finite run achieves: "bound" is a client with no overhead
that sends each row, in input order, to the slot that would finish it first, and the share of the ideal it
reaches is printed with it (the rest is the unavoidable drain; a client that reorders the tail can beat it).
Every figure but the tail comes from the simulator's own counters, the same for each client: completed
tokens / (last reply - first request over the fleet); slot use per port = busy slot-seconds / (span x slots);
idle = the live slot-time (a slow port weighs 1/slowness) left unused before each port first ran full
(ramp-up), until it last ran full (steady) and after (drain).
Tail: the last new request sent to the last completion, as the client saw it.
Clients (a fresh simulator for each):
  gen-pipeline  `generate` with its defaults (capacity and queue margin from /server_info).
  round-robin   a bare asyncio+aiohttp script: one semaphore of 8 x 16, ports in turn, next port on failure.
                By default on fleet A only: on B it waits on the slow port (an eighth of the rows at a quarter
                of the speed, ~30% of the ideal) and would double the benchmark's time.
  gateway       `sglang-router` (PyPI) --policy cache_aware in front of the 8 ports, the same bare script
                pointed at it with the same semaphore.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simfleet import ENV, sim_run  # noqa: E402

from gen_pipeline.sim import free_ports  # noqa: E402
from gen_pipeline.tokens import TINY_TOKENIZER, load_counter  # noqa: E402

CLIENTS = ("gen-pipeline", "round-robin", "gateway")
BAD_GATEWAY_P = 0.3
SLOW = 4.0
WORDS = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "oscar", "sierra", "tango")


@dataclass
class Result:
    """One client on one fleet."""

    tokens_per_s: float
    tail_s: float | None
    slot_use: list[float]  # per port, in fleet order
    requests: list[int]
    late: float  # how much longer the simulator's slots took than the model asked (a busy machine)
    span_s: float = 0.0
    idle: tuple[float, float, float] = (0.0, 0.0, 0.0)  # idle share of live slot-time: ramp-up, steady, drain
    note: str = ""
    sim_cpu_s: float = 0.0
    client_cpu_s: float = 0.0


def write_prompts(path: Path, n: int, seed: int = 7) -> list[dict[str, Any]]:
    """`n` chat rows of varied length, each with its own max_tokens in 64-512."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 600)))
        rows.append({"id": i, "messages": [{"role": "user", "content": f"Q{i}: {text}"}],
                     "max_tokens": rng.randint(64, 512)})  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def latencies(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[float]:
    """Each row's latency in the simulator's model, on a server of normal speed."""
    counts = load_counter(str(TINY_TOKENIZER)).count([r["messages"] for r in rows])
    out = [r["max_tokens"] for r in rows]
    return [o * args.token_latency + int(p) * args.prompt_token_latency for o, p in zip(out, counts, strict=True)]


def slowness(fleet: str) -> list[float]:
    """Each port's latency factor (inf: dead); B's slow, dead and bad-gateway ports are the first three, C's
    slow ones the first two (its flaky third fails on arrival, holding no slot: counted in full)."""
    if fleet == "C":
        return [2.0, 2.0] + [1.0] * 6
    return [1.0] * 8 if fleet == "A" else [SLOW, math.inf] + [1.0] * 6


def ideal(rows: list[dict[str, Any]], latency: list[float], args: argparse.Namespace, fleet: str) -> float:
    """Completed tokens/s the latency model allows on `fleet`, every live slot busy all the time."""
    slots = args.max_running * sum(1 / f for f in slowness(fleet))
    return slots * sum(r["max_tokens"] for r in rows) / sum(latency)


def finite_bound(rows: list[dict[str, Any]], latency: list[float], args: argparse.Namespace, fleet: str) -> float:
    """Completed tokens/s of a client with no overhead at all on a run of these rows: each, in input order,
    sent at once to the slot that would finish it first. The ideal assumes every slot busy to the end; this
    counts the drain no finite run avoids (the last requests finishing one by one)."""
    speeds = [f for f in slowness(fleet) if math.isfinite(f)]
    heaps = {f: [0.0] * (args.max_running * speeds.count(f)) for f in set(speeds)}  # slots' free-at times
    end = 0.0
    for lat in latency:
        speed = min(heaps, key=lambda f: heaps[f][0] + lat * f)
        done = heaps[speed][0] + lat * speed
        heapq.heapreplace(heaps[speed], done)
        end = max(end, done)
    return sum(r["max_tokens"] for r in rows) / end


def fleet_flags(fleet: str, ports: list[int]) -> list[str]:
    """The simulator's fault flags for a fleet: B's slow, dead and bad-gateway ports are the first three."""
    if fleet == "A":
        return []
    if fleet == "C":
        return ["--slow", f"{ports[0]}:2", "--slow", f"{ports[1]}:2", "--flaky", f"{ports[2]}:0.5"]
    return ["--slow", f"{ports[0]}:{SLOW}", "--dead", str(ports[1]), "--bad-gateway", f"{ports[2]}:{BAD_GATEWAY_P}"]


def run_generate(inp: Path, ports: list[int], out: Path, extra: list[str]) -> tuple[float | None, list[int]]:
    """gen-pipeline on the fleet: its tail and requests per port from summary.json."""
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    cmd = [sys.executable, "-m", "gen_pipeline", "generate", "--input", str(inp), "--out", str(out),
           "--servers", servers, "--max-tokens", "512", "--progress", "off", *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise SystemExit(f"generate failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    lines = (out / "completions.jsonl").read_bytes().splitlines()
    ids = {orjson.loads(line)["id"] for line in lines}
    if not summary["completed"] == len(lines) == len(ids) == sum(1 for _ in inp.open("rb")):
        raise SystemExit(f"gen-pipeline lost or duplicated rows: {len(lines)} lines, {len(ids)} ids")
    views = summary["servers"]
    return summary.get("tail_s"), [views[f"http://127.0.0.1:{p}"]["requests"] for p in ports]


async def bare_client(rows: list[dict[str, Any]], urls: list[str], concurrency: int) -> float:
    """Send every row: a global semaphore, `urls` in turn, the next one on failure; returns the tail."""
    turn = itertools.cycle(urls)
    sem = asyncio.Semaphore(concurrency)
    last_sent = last_done = 0.0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(row: dict[str, Any]) -> None:
            nonlocal last_sent, last_done
            body = orjson.dumps({"model": "sim-model", "messages": row["messages"], "max_tokens": row["max_tokens"]})
            async with sem:
                last_sent = time.monotonic()
                for _ in range(50):
                    with contextlib.suppress(aiohttp.ClientError):
                        post = session.post(next(turn) + "/v1/chat/completions", data=body,
                                            headers={"Content-Type": "application/json"})  # fmt: skip
                        async with post as r:
                            await r.read()
                            if r.status == 200:
                                last_done = time.monotonic()
                                return
                raise SystemExit(f"row {row['id']} failed 50 times")

        await asyncio.gather(*(one(r) for r in rows))
    return last_done - last_sent


@contextlib.contextmanager
def gateway(ports: list[int]) -> Iterator[str]:
    """sglang-router in front of `ports`, cache_aware; yields its URL once every live port is registered."""
    port, metrics = free_ports(2)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-port", str(metrics), "--policy", "cache_aware", "--log-level", "warn",
           "--worker-urls", *urls]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_workers(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_workers(url: str, proc: subprocess.Popen[bytes], settle_s: float = 3.0) -> None:
    """Until the router lists its workers and their number has not changed for `settle_s`."""
    seen, since, deadline = -1, time.monotonic(), time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sglang-router exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/workers", timeout=2) as r:
                n = len(orjson.loads(r.read()).get("workers", []))
        except OSError:
            n = -1
        if n != seen:
            seen, since = n, time.monotonic()
        elif n > 0 and time.monotonic() - since >= settle_s:
            return
        time.sleep(0.2)
    raise SystemExit("sglang-router did not register its workers within 60 s")


def measure(
    client: str, fleet: str, rows: list[dict[str, Any]], inp: Path, tmp: Path, args: argparse.Namespace
) -> Result:
    """One client against a fresh simulated fleet."""
    ports = free_ports(8)
    load = ["--max-running", str(args.max_running), "--token-latency", str(args.token_latency),
            "--prompt-token-latency", str(args.prompt_token_latency), "--completion-words", "100000",
            "--context-length", "32768", "--light-template", "--seed", "1"]  # fmt: skip
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    before = cpu_seconds()
    with sim_run(ports, *load, *fleet_flags(fleet, ports)) as sim:
        sim_before = process_cpu_s(sim.proc.pid)
        if client == "gen-pipeline":
            extra = [] if args.queue_margin is None else ["--queue-margin", str(args.queue_margin)]
            tail, seen = run_generate(inp, ports, tmp / f"{fleet}-out", extra)
        elif client == "round-robin":
            tail, seen = asyncio.run(bare_client(rows, urls, 8 * args.max_running)), []
        else:
            with gateway(ports) as url:
                tail, seen = asyncio.run(bare_client(rows, [url], 8 * args.max_running)), []
        sim_end = process_cpu_s(sim.proc.pid)
    result = summarize(sim.port_stats(), ports, args.max_running, tail, seen, fleet)
    result.sim_cpu_s, result.client_cpu_s = sim_end - sim_before, cpu_seconds() - before - sim_end
    return result


def process_cpu_s(pid: int) -> float:
    """CPU seconds a running process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """CPU seconds of this process and the children it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def summarize(
    stats: dict[int, dict[str, Any]], ports: list[int], slots: int, tail: float | None, seen: list[int], fleet: str
) -> Result:
    """Tokens/s and slot use from the simulator's counters."""
    firsts = [s["first_request_at"] for s in stats.values() if s.get("first_request_at")]
    lasts = [s["last_reply_at"] for s in stats.values() if s.get("last_reply_at")]
    span = max(lasts) - min(firsts)
    tokens = sum(s.get("output_tokens") or 0 for s in stats.values())
    use = [(stats[p].get("busy_s") or 0) / (span * slots) for p in ports]
    requests = [int(stats[p].get("requests") or 0) for p in ports]
    busy, model = (sum(s.get(k) or 0 for s in stats.values()) for k in ("busy_s", "model_s"))
    note = "" if not seen else ("summary requests = server's" if seen == requests else f"summary {seen} != {requests}")
    idle = idle_shares([stats[p] for p in ports], slowness(fleet), slots, min(firsts), max(lasts))
    return Result(tokens / span, tail, use, requests, busy / model - 1 if model else 0.0, span, idle, note)


def idle_shares(
    stats: list[dict[str, Any]], speeds: list[float], slots: int, start: float, end: float
) -> tuple[float, float, float]:
    """The share of the live ports' slot-time (a slow port weighs 1/slowness, as in the ideal) that sat idle
    before each port first ran full (ramp-up), between then and the last time it ran full (steady state), and
    after (drain), from the simulator's occupancy counters."""
    parts, weight = [0.0, 0.0, 0.0], 0.0
    for s, f in zip(stats, speeds, strict=True):
        if not math.isfinite(f):
            continue
        weight += 1 / f
        full_from, full_to = s.get("first_full_at"), s.get("last_full_at")
        if full_from is None or full_to is None:  # never ran full: all of it counts as steady-state idle
            parts[1] += (slots * (end - start) - (s.get("slot_area_s") or 0)) / f
            continue
        a0, a1, area = s["area_at_first_full"], s["area_at_last_full"], s["slot_area_s"]
        parts[0] += (slots * (full_from - start) - a0) / f
        parts[1] += (slots * (full_to - full_from) - (a1 - a0)) / f
        parts[2] += (slots * (end - full_to) - (area - a1)) / f
    total = weight * slots * (end - start)
    return parts[0] / total, parts[1] / total, parts[2] / total


def default_clients(fleet: str) -> tuple[str, ...]:
    """Every client on A; on B round-robin only when asked (it waits on the slow port for most of the run)."""
    return CLIENTS if fleet == "A" else ("gen-pipeline", "gateway")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=7000)
    ap.add_argument("--fleets", default="A,B")
    ap.add_argument("--clients", default=None, help="default: all three on A, gen-pipeline and gateway on B")
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--token-latency", type=float, default=0.008)
    ap.add_argument("--prompt-token-latency", type=float, default=0.00002)
    ap.add_argument("--queue-margin", type=int, default=None, help="gen-pipeline's --queue-margin (default: its own)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-balance-"))
    rows = write_prompts(tmp / "prompts.jsonl", args.prompts)
    print(f"{args.prompts} prompts, max_tokens 64-512, {args.token_latency * 1000:g} ms/output token, "
          f"{args.prompt_token_latency * 1e6:g} ms/1k prompt tokens, --max-running {args.max_running}")  # fmt: skip
    latency = latencies(rows, args)
    for fleet in args.fleets.split(","):
        best, bound = ideal(rows, latency, args, fleet), finite_bound(rows, latency, args, fleet)
        print(
            f"\nfleet {fleet}: ideal {best:,.0f} tokens/s; a client with no overhead, each row in turn to the "
            f"slot that finishes it first: {bound:,.0f} ({bound / best:.1%}, the rest is the drain of a finite run)"
        )
        print(f"{'client':<14}{'tokens/s':>10}{'of ideal':>9}{'of bound':>9}{'tail s':>7}"
              f"{'idle: ramp':>11}{'steady':>7}{'drain':>6}{'sim late':>9}{'of paced':>9}{'span s':>7}  "
              "slot use per port (%)  requests per port")  # fmt: skip
        for client in args.clients.split(",") if args.clients else default_clients(fleet):
            r = measure(client, fleet, rows, tmp / "prompts.jsonl", tmp, args)
            tail = f"{r.tail_s:.2f}" if r.tail_s is not None else "-"
            use = " ".join(f"{u * 100:3.0f}" for u in r.slot_use)
            paced = r.tokens_per_s / best * (1 + r.late)  # of the ideal at the pace the simulator kept
            ramp, steady, drain = (f"{x:.1%}" for x in r.idle)
            print(f"{client:<14}{r.tokens_per_s:>10,.0f}{r.tokens_per_s / best:>9.1%}{r.tokens_per_s / bound:>9.1%}"
                  f"{tail:>7}{ramp:>11}{steady:>7}{drain:>6}{r.late:>9.1%}{paced:>9.1%}{r.span_s:>7.0f}  {use}  "
                  f"{' '.join(map(str, r.requests))}  cpu s: sim {r.sim_cpu_s:.1f} client {r.client_cpu_s:.1f}  "
                  f"{r.note}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
