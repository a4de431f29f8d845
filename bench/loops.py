"""The loop guard: a night where 5% of the answers loop, with --loop-guard on and off, side by side in one run;
then the guard's false positives on legitimately repetitive answers.

    python bench/loops.py [--rows 1200] [--ports 4] [--max-running 16] [--token-latency 0.002]
                          [--max-tokens 8192] [--p-loop 0.05] [--legit-seeds 4]

Workload (issue 54's night of 8 servers, scaled down to about a minute on 2 vCPUs): `--ports` simulated SGLang
ports in a separate process, `--max-running` slots each, `--token-latency` seconds per decoded token of a
request, answers of 1 to 256 words (a word a token), of which `--p-loop` loop from a drawn point to
`--max-tokens` (sim/loops.py: a unit of 1 to 48 words repeated). The same rows and the same draws for both
runs. Printed per run:
  - loop tokens: tokens the ports decoded inside loops, as a share of every token they decoded (the
    simulator's own counters: what the GPUs spent);
  - looping answers in the output: written lines whose content or reasoning the detector finds a loop in;
  - valid tokens per second of fleet time: completion tokens of the written lines that do not loop, per
    second of the run's wall time and per port (the fleet is booked for the whole run);
  - loops stopped and resampled (rejected.jsonl), and rows ledgered `degenerate` (every attempt looped).
`--seed 1` is sent, so that a resample is another draw (without a seed the simulator answers a prompt the same
way every time).
Then the detector alone over bench/repetitive.py: its false positives on `--legit-seeds` x 400 legitimately
repetitive answers streamed in 4-character pieces, and where it stops its 200 loops (characters after the loop
began). Last, issue 54's targets with this run's figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import repetitive  # noqa: E402
from inputs import short_rows, write_jsonl  # noqa: E402
from simfleet import ENV, sim_run  # noqa: E402

from gen_pipeline.answers.loops import LoopDetector  # noqa: E402
from gen_pipeline.sim import free_ports  # noqa: E402

TOKENIZER = str(ROOT / "gen_pipeline/data/tiny-tokenizer")
LOOP_SHARE_TARGET = 0.10  # loop tokens of all decode tokens, guard on (76% without a guard in the night)
SPEEDUP_TARGET = 2.0  # valid tokens per second of fleet time, guard on against off
FALSE_POSITIVE_TARGET = 0.001


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1200)
    ap.add_argument("--ports", type=int, default=4)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--token-latency", type=float, default=0.002)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--p-loop", type=float, default=0.05)
    ap.add_argument("--legit-seeds", type=int, default=4, help="400 legitimate answers per seed")
    return ap.parse_args()


def loops(text: str | None) -> bool:
    """Whether the detector finds a loop in `text`, fed in 4-character pieces."""
    if not text:
        return False
    detector = LoopDetector()
    return any(detector.feed(text[i : i + 4]) for i in range(0, len(text), 4))


def night(args: argparse.Namespace, inp: Path, out: Path, guard: str) -> dict[str, Any]:
    """One generate run on a fresh simulated fleet; what it wrote and what the ports decoded."""
    ports = free_ports(args.ports)
    flags = ("--max-running", str(args.max_running), "--token-latency", str(args.token_latency),
             "--context-length", str(2 * args.max_tokens), "--completion-words", "256",
             "--p-loop", str(args.p_loop))  # fmt: skip
    with sim_run(ports, *flags) as sim:
        cmd = [sys.executable, "-m", "gen_pipeline", "generate", "--input", str(inp), "--out", str(out),
               "--servers", ",".join(f"127.0.0.1:{p}" for p in ports), "--tokenizer", TOKENIZER,
               "--max-tokens", str(args.max_tokens), "--progress", "off", "--loop-guard", guard,
               "--seed", "1"]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
        wall = time.monotonic() - start
        if done.returncode != 0:
            raise SystemExit(f"generate --loop-guard {guard} failed ({done.returncode}): {done.stderr[-2000:]}")
    stats = sim.port_stats()
    lines = [orjson.loads(x) for x in (out / "completions.jsonl").read_bytes().splitlines()]
    ledger = out / "failures.jsonl"
    failures = [orjson.loads(x) for x in ledger.read_bytes().splitlines()] if ledger.exists() else []
    looping = [r for r in lines if loops(r["completion"]) or loops(r.get("reasoning_content"))]
    valid = sum(r["completion_tokens"] or 0 for r in lines if r not in looping)
    decoded = sum(s["decoded_tokens"] or 0 for s in stats.values())
    return {
        "wall": wall,
        "written": len(lines),
        "looping": len(looping),
        "degenerate": sum(f["reason"] == "degenerate" for f in failures),
        "rejected": sum(1 for _ in (out / "rejected.jsonl").open("rb")) if (out / "rejected.jsonl").exists() else 0,
        "other_failures": sum(f["reason"] != "degenerate" for f in failures),
        "decoded": decoded,
        "loop_tokens": sum(s["loop_tokens"] or 0 for s in stats.values()),
        "stopped": sum(s["stopped"] or 0 for s in stats.values()),
        "valid": valid,
        "valid_per_s": valid / wall,
        "valid_per_port_s": valid / wall / args.ports,
    }


def detector_figures(seeds: int) -> dict[str, Any]:
    """False positives on the legitimate answers; where the loops are stopped."""
    legit = [a for seed in range(seeds) for a in repetitive.legit_answers(seed, 400)]
    start = time.process_time()
    fired = [a["kind"] for a in legit if loops(a["text"])]
    cpu = time.process_time() - start
    chars = sum(len(a["text"]) for a in legit)
    delays = []
    for answer in repetitive.loop_answers(0, 200):
        detector, text = LoopDetector(), answer["text"]
        at = next((i + 4 for i in range(0, len(text), 4) if detector.feed(text[i : i + 4])), None)
        delays.append(None if at is None else at - answer["loop_start"])
    found = [d for d in delays if d is not None]
    return {
        "legit": len(legit),
        "kinds": len({a["kind"] for a in legit}),
        "fired": fired,
        "us_per_piece": cpu / (chars / 4) * 1e6,
        "loops": len(delays),
        "missed": len(delays) - len(found),
        "median_delay": statistics.median(found),
        "max_delay": max(found),
    }


def report(args: argparse.Namespace, runs: dict[str, dict[str, Any]], det: dict[str, Any]) -> None:
    print(
        f"workload: {args.rows} rows, {args.ports} ports x {args.max_running} slots, {args.token_latency * 1e3:g} ms "
        f"a token, answers of 1-256 tokens, {args.p_loop:.0%} looping to --max-tokens {args.max_tokens}"
    )
    print(
        f"{'--loop-guard':<14}{'wall s':>8}{'loop tokens':>14}{'of decoded':>12}{'looping rows out':>18}"
        f"{'resampled':>11}{'degenerate':>12}{'valid tok/s':>13}{'per port':>10}"
    )
    for guard, r in runs.items():
        share = r["loop_tokens"] / max(r["decoded"], 1)
        print(
            f"{guard:<14}{r['wall']:>8.1f}{r['loop_tokens']:>14,.0f}{share:>12.1%}{r['looping']:>18}"
            f"{r['rejected']:>11}{r['degenerate']:>12}{r['valid_per_s']:>13,.0f}{r['valid_per_port_s']:>10,.0f}"
        )
    on, off = runs["on"], runs["off"]
    speedup = on["valid_per_s"] / off["valid_per_s"]
    print(
        f"guard on: {on['stopped']:.0f} requests stopped on the ports; {on['written']} rows written "
        f"({on['other_failures']} other failures), off: {off['written']} written; valid tokens "
        f"{on['valid']:,} vs {off['valid']:,}; valid tokens per second of fleet time {speedup:.2f}x"
    )
    rate = len(det["fired"]) / det["legit"]
    print(
        f"detector: {len(det['fired'])} of {det['legit']} legitimately repetitive answers ({det['kinds']} kinds) "
        f"stopped ({rate:.2%}){': ' + ', '.join(det['fired']) if det['fired'] else ''}; "
        f"{det['loops'] - det['missed']} of {det['loops']} loops stopped, median {det['median_delay']:,.0f} and "
        f"at most {det['max_delay']:,} characters after they began; {det['us_per_piece']:.1f} us CPU a "
        "4-character piece"
    )
    on_share = on["loop_tokens"] / max(on["decoded"], 1)
    targets = [
        (f"loop tokens of all decode tokens <= {LOOP_SHARE_TARGET:.0%}", f"{on_share:.1%} (off: "
         f"{off['loop_tokens'] / max(off['decoded'], 1):.1%})", on_share <= LOOP_SHARE_TARGET),
        ("looping answers in the output: 0", f"{on['looping']} (off: {off['looping']})", on["looping"] == 0),
        (f"valid tokens per second of fleet time >= {SPEEDUP_TARGET:g}x guard off", f"{speedup:.2f}x",
         speedup >= SPEEDUP_TARGET),
        (f"false positives on legitimate answers <= {FALSE_POSITIVE_TARGET:.1%}", f"{rate:.2%} of {det['legit']}",
         rate <= FALSE_POSITIVE_TARGET),
    ]  # fmt: skip
    print("issue 54's targets:")
    for what, figure, ok in targets:
        print(f"  {what:<62}{figure:<28}{'met' if ok else 'NOT met'}")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="gp-loops-") as tmp:
        inp = Path(tmp) / "rows.jsonl"
        write_jsonl(inp, short_rows(args.rows))
        runs = {guard: night(args, inp, Path(tmp) / guard, guard) for guard in ("on", "off")}
    report(args, runs, detector_figures(args.legit_seeds))


if __name__ == "__main__":
    main()
