"""Claimers benchmark: N `generate --join` processes, each on its own latency-bound simulated fleet.

    python bench/claimers.py [--claimers 1,2,4] [--slow-claimers 4] [--rows-per-claimer 400]

Each claimer is a separate `generate --join --shards V` process over one run directory, pointed at its own
`gen-pipeline simulate` process (--ports-per-fleet ports, --max-running slots each, every request decoding
exactly --max-tokens at --token-latency a token): the fleets set the pace, not the client's CPU.
Printed, from one run:
  (a) rows/s of N claimers on N fleets (N x --rows-per-claimer rows) against N x one claimer's rate
      (the target: >= 0.9 x N); rows/s over the fleets' span (first request to last reply, from the
      simulators' own clocks) and over the wall time (processes started to the last one's exit).
  (b) --slow-claimers claimers, one fleet --slow x slower: each claimer's busy time (its fleet's first
      request to last reply) and the time from the median claimer's last row to the run's end (the last
      reply anywhere), as a ratio to the median claimer's busy time (the target: <= 1.5); beside it what a
      static split of the rows (an equal share each, at the rates measured) would give.
  (c) in every run, every input key exactly once in the export and in the shard files: 0 lost, 0 twice.
With --read-cost FILE, also the CPU seconds one claim's read of FILE takes (each claim reads the input once).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simfleet import ENV, SimRun, sim_run  # noqa: E402

from gen_pipeline.sim import free_ports  # noqa: E402

GENERATE = [sys.executable, "-m", "gen_pipeline", "generate", "--progress", "off"]


@dataclass
class Claimer:
    """One claimer's fleet as its simulator counted it."""

    first: float  # time.time() of the fleet's first generation request
    last: float  # ... and of its last reply
    rows: int

    @property
    def busy(self) -> float:
        """First row to last row."""
        return self.last - self.first


@dataclass
class Run:
    """One run of N claimers: per claimer figures, the wall time, and the exactly-once check."""

    claimers: list[Claimer]
    wall: float
    rows: int
    check: str

    @property
    def span(self) -> float:
        """The fleets' first request to the last reply anywhere (a claimer that got no row has neither)."""
        busy = [c for c in self.claimers if c.rows] or self.claimers
        return max(c.last for c in busy) - min(c.first for c in busy)


def write_prompts(path: Path, n: int) -> list[int]:
    """`n` short chat rows with integer ids; returns the ids."""
    with path.open("wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"id": i, "messages": [{"role": "user", "content": f"question {i}: say more"}]}))
            f.write(b"\n")
    return list(range(n))


def fleet_flags(args: argparse.Namespace) -> list[str]:
    """The latency model every fleet runs."""
    return ["--max-running", str(args.max_running), "--token-latency", str(args.token_latency),
            "--completion-words", "100000", "--light-template", "--seed", "1"]  # fmt: skip


def run_claimers(n: int, inp: Path, out: Path, args: argparse.Namespace, slow: float | None = None) -> Run:
    """`n` claimers over `out`, each on its own fleet (the first one `slow` x slower); every key checked."""
    with contextlib.ExitStack() as stack:
        sims: list[SimRun] = []
        fleets = []
        for i in range(n):
            ports = free_ports(args.ports_per_fleet)
            extra = [f for p in ports for f in ("--slow", f"{p}:{slow}")] if slow and i == 0 else []
            sims.append(stack.enter_context(sim_run(ports, *fleet_flags(args), *extra)))
            fleets.append(",".join(f"127.0.0.1:{p}" for p in ports))
        start = time.time()
        procs = [launch(inp, out, servers, i, args) for i, servers in enumerate(fleets)]
        for proc in procs:
            if proc.wait() != 0:
                log = Path(out.parent / f"{out.name}-claimer{procs.index(proc)}.log").read_text()
                raise SystemExit(f"a claimer exited with {proc.returncode}: {log[-2000:]}")
        wall = time.time() - start
    claimers = [fleet_figures(sim) for sim in sims]
    return Run(claimers, wall, sum(c.rows for c in claimers), check_once(inp, out))


def launch(inp: Path, out: Path, servers: str, i: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """One `generate --join` claimer, its output in OUT-claimerI.log."""
    log = (out.parent / f"{out.name}-claimer{i}.log").open("wb")
    cmd = [*GENERATE, "--input", str(inp), "--out", str(out), "--servers", servers, "--join",
           "--shards", str(args.shards), "--max-tokens", str(args.max_tokens)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV)


def fleet_figures(sim: SimRun) -> Claimer:
    """A claimer's first request, last reply and completions, over its fleet's ports."""
    stats = sim.port_stats().values()
    firsts = [s["first_request_at"] for s in stats if s.get("first_request_at")]
    lasts = [s["last_reply_at"] for s in stats if s.get("last_reply_at")]
    rows = int(sum(s.get("completions") or 0 for s in stats))
    if not firsts:
        return Claimer(0.0, 0.0, 0)
    return Claimer(min(firsts), max(lasts), rows)


def check_once(inp: Path, out: Path) -> str:
    """Every input key exactly once, in the shard files and in `export`'s dataset; raises otherwise."""
    want = sorted(orjson.loads(line)["id"] for line in inp.read_bytes().splitlines())
    files = sorted(out.glob("shards/*/completions.jsonl"))
    found = sorted(orjson.loads(line)["id"] for f in files for line in f.read_bytes().splitlines())
    exported = out.parent / f"{out.name}-export"
    done = subprocess.run([sys.executable, "-m", "gen_pipeline", "export", str(out), "--out", str(exported)],
                          capture_output=True, text=True, env=ENV)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"export refused the run: {done.stderr[-2000:]}")
    import pyarrow.parquet as pq

    tables = [pq.read_table(f, columns=["id"]) for f in sorted(exported.rglob("*.parquet"))]
    ids = sorted(int(i) for t in tables for i in t["id"].to_pylist())
    lost, twice = len(set(want) - set(found)), len(found) - len(set(found))
    if lost or twice or ids != want:
        raise SystemExit(f"not exactly once: {lost} lost, {twice} twice in the files; export {len(ids)} rows")
    return f"{len(want):,} keys once (files and export), 0 lost, 0 twice"


def fleet_rate(args: argparse.Namespace) -> float:
    """Rows/s one fleet's latency model allows: its slots over one request's decode time."""
    return args.ports_per_fleet * args.max_running / (args.max_tokens * args.token_latency)


def scaling(runs: dict[int, Run], args: argparse.Namespace) -> list[str]:
    """Part (a): rows/s by N, of what the fleets' latency model allows, and against N x one claimer's rate."""
    one = runs[min(runs)]
    base_span, base_wall = one.rows / one.span / min(runs), one.rows / one.wall / min(runs)
    lines = [f"(a) N claimers, each on its own fleet (the model allows {fleet_rate(args):.1f} rows/s a fleet)",
             f"{'N':>3}{'rows':>7}{'span s':>8}{'rows/s':>8}{'of model':>9}{'x N*one':>9}{'wall s':>8}"
             f"{'rows/s':>8}{'x N*one':>9}  target: x N*one >= 0.9"]  # fmt: skip
    for n, run in sorted(runs.items()):
        span_rate, wall_rate = run.rows / run.span, run.rows / run.wall
        ratio, model = span_rate / (n * base_span), span_rate / (n * fleet_rate(args))
        verdict = "met" if ratio >= 0.9 else "NOT met"
        lines.append(f"{n:>3}{run.rows:>7}{run.span:>8.1f}{span_rate:>8.1f}{model:>9.0%}{ratio:>9.2f}"
                     f"{run.wall:>8.1f}{wall_rate:>8.1f}{wall_rate / (n * base_wall):>9.2f}  {verdict}")  # fmt: skip
    return lines


def straggler(run: Run, slow: float) -> list[str]:
    """Part (b): each claimer's busy time; the median's last row to the run's end, over its busy time."""
    busy = [c for c in run.claimers if c.rows] or run.claimers  # a claimer that got no row has no times
    end, begin = max(c.last for c in busy), min(c.first for c in busy)
    median = sorted(busy, key=lambda c: c.last)[(len(busy) - 1) // 2]  # the lower middle
    gap = end - median.last
    lines = [f"(b) {len(run.claimers)} claimers, claimer 0's fleet {slow:g}x slower"]
    for i, c in enumerate(run.claimers):
        lines.append(f"  claimer {i}: {c.rows:>5} rows, busy {c.busy:6.1f} s ({c.first - begin:4.1f} to "
                     f"{c.last - begin:5.1f}), {c.rows / c.busy if c.busy else 0:5.1f} rows/s")  # fmt: skip
    ratio = gap / median.busy if median.busy else math.inf
    lines.append(f"  median claimer's last row to the run's end: {gap:.1f} s = {ratio:.2f}x its busy time "
                 f"{median.busy:.1f} s  (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'}); "
                 f"run's end at {(end - begin) / (median.busy or math.inf):.2f}x the median busy time")  # fmt: skip
    lines.append("  " + static_split(run))
    return lines


def static_split(run: Run) -> str:
    """What an equal static share per claimer would give at the rates each fleet kept in this run."""
    share = run.rows / len(run.claimers)
    ends = sorted(share / (c.rows / c.busy) for c in run.claimers if c.rows)
    median, end = ends[(len(ends) - 1) // 2], ends[-1]
    return (f"a static split (an equal share each, these rates): median busy {median:.1f} s, end {end:.1f} s, "
            f"median's last row to the end {(end - median) / median:.2f}x, the end at {end / median:.2f}x")  # fmt: skip


def read_cost(path: Path, shards: int) -> str:
    """Seconds one claim's read of `path` takes in the tokenizer thread: holding no shard (the cost of the
    rows of other shards alone) and holding a batch of V/16 (their rows parsed, not counted)."""
    from gen_pipeline.inputs.source import PromptSource

    parts = []
    for held in (0, max(1, shards // 16)):
        start = time.process_time()
        items = sum(1 for _ in PromptSource(path, None, lambda key, held=held: key % shards < held))
        parts.append(f"{held} of {shards} shards held: {time.process_time() - start:.2f} s CPU ({items:,} rows)")
    return f"one claim's read of {path.name} ({path.stat().st_size / 1e6:,.0f} MB): " + "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claimers", default="1,2,4", help="N for part (a), comma separated (the smallest is the base)")
    ap.add_argument("--slow-claimers", type=int, default=4, help="N for part (b) (0: skip it)")
    ap.add_argument("--slow", type=float, default=4.0, help="part (b): the slow fleet's latency factor")
    ap.add_argument("--rows-per-claimer", type=int, default=400)
    ap.add_argument("--ports-per-fleet", type=int, default=2)
    ap.add_argument("--max-running", type=int, default=4)
    ap.add_argument("--token-latency", type=float, default=0.02)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--shards", type=int, default=256)
    ap.add_argument("--read-cost", type=Path, help="also time one claim's read of this input (bench/inputs.py)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-claimers-"))
    print(f"{args.rows_per_claimer} rows per claimer, {args.ports_per_fleet} ports x {args.max_running} slots a fleet, "
          f"{args.max_tokens} tokens x {args.token_latency * 1000:g} ms a request, --shards {args.shards}; "
          f"load average at start {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    runs, checks = {}, []
    for n in sorted({int(x) for x in args.claimers.split(",")}):
        inp = tmp / f"in-{n}.jsonl"
        write_prompts(inp, n * args.rows_per_claimer)
        runs[n] = run_claimers(n, inp, tmp / f"run-{n}", args)
        checks.append(f"  N={n}: {runs[n].check}")
    print("\n".join(scaling(runs, args)), flush=True)
    if args.slow_claimers:
        n = args.slow_claimers
        inp = tmp / f"in-slow-{n}.jsonl"
        write_prompts(inp, n * args.rows_per_claimer)
        run = run_claimers(n, inp, tmp / f"run-slow-{n}", args, slow=args.slow)
        checks.append(f"  slow, N={n}: {run.check}")
        print("\n".join(straggler(run, args.slow)))
    print("(c) exactly once\n" + "\n".join(checks))
    if args.read_cost is not None:
        print(read_cost(args.read_cost, args.shards))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
