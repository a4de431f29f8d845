"""Benchmark `gen-pipeline prepare` on an Infinity-Instruct-shaped JSONL file.

    .venv/bin/python bench/prepare_bench.py [--rows 650000] [--dup-rate 0.05] [--workdir DIR] [--keep]
        [--with-exclude]

Writes ROWS ShareGPT rows (`id`, `conversations` with human/gpt turns, `label`, `langdetect`): some
multi-turn, about 2% long prompts (10-40 kB), about 15% non-ASCII, and DUP_RATE repeats of earlier
prompts with other whitespace and Unicode forms (which prepare must collapse). Then runs prepare in
a child process and prints rows/s, MB/s and the child's peak RSS (from wait4), next to the RSS of
`prepare --help` (the interpreter and imports alone). --with-exclude runs prepare once more with the
first output as --exclude, as the nightly job does (every row is then excluded).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any

import orjson

# One string reads better than a 33-item list literal.
WORDS = (  # noqa: SIM905
    "the of and to in is for on with as by at from model data value function train answer step "
    "question explain write code python list number result error system memory network example"
).split()
NON_ASCII = ["café", "naïve", "über", "你好世界", "数据", "こんにちは", "привет", "Ελληνικά", "résumé"]


def sentence_pool(rng: random.Random, n: int, non_ascii: bool) -> list[str]:
    """Short random sentences to compose rows from (composing is much faster than sampling words)."""
    words = WORDS + NON_ASCII if non_ascii else WORDS
    return [" ".join(rng.choices(words, k=rng.randint(6, 24))).capitalize() + "." for _ in range(n)]


def text(rng: random.Random, pool: list[str], sentences: int) -> str:
    return " ".join(rng.choices(pool, k=sentences))


def conversation(rng: random.Random, i: int, pools: tuple[list[str], list[str]]) -> list[dict[str, str]]:
    """One ShareGPT conversation whose first question is unique to row `i`."""
    pool = pools[1] if rng.random() < 0.15 else pools[0]
    long_prompt = rng.random() < 0.02
    turns = 1 if rng.random() < 0.8 else rng.randint(2, 3)
    conv = []
    for t in range(turns):
        size = rng.randint(150, 600) if long_prompt and t == 0 else rng.randint(2, 8)
        question = (f"[{i}] " if t == 0 else "") + text(rng, pool, size)
        conv.append({"from": "human", "value": question})
        conv.append({"from": "gpt", "value": text(rng, pool, rng.randint(4, 20))})
    return conv


def variant(conv: list[dict[str, str]]) -> list[dict[str, str]]:
    """The same prompt as prepare sees it, written differently: NFD, extra and other whitespace."""
    out = []
    for turn in conv:
        value = unicodedata.normalize("NFD", turn["value"]).replace(" ", "  ", 3)
        out.append({"from": turn["from"], "value": f" {value}\n"})
    return out


def write_source(path: Path, rows: int, dup_rate: float, seed: int = 0) -> int:
    """Write the benchmark input; return its size in bytes."""
    rng = random.Random(seed)
    pools = (sentence_pool(rng, 4000, False), sentence_pool(rng, 4000, True))
    recent: list[list[dict[str, str]]] = []
    with path.open("wb") as f:
        for i in range(rows):
            if recent and rng.random() < dup_rate:
                conv = variant(rng.choice(recent))
            else:
                conv = conversation(rng, i, pools)
                if len(recent) < 20_000:
                    recent.append(conv)
                else:
                    recent[rng.randrange(len(recent))] = conv
            row: dict[str, Any] = {"id": i, "conversations": conv}
            row["label"] = {"ability_en": ["writing"], "cate_ability_en": ["general"]}
            row["langdetect"] = "en"
            f.write(orjson.dumps(row) + b"\n")
    return path.stat().st_size


def run_child(argv: list[str]) -> tuple[float, float, int, str]:
    """Run a child; return wall seconds, CPU seconds, peak RSS in MiB (from wait4) and its stdout."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime
    return time.monotonic() - start, cpu, usage.ru_maxrss // 1024, out.strip()


def prepare_argv(*args: Path | str) -> list[str]:
    return [sys.executable, "-m", "gen_pipeline", "prepare", *map(str, args)]


def bench(work: Path, rows: int, dup_rate: float, with_exclude: bool) -> None:
    src, out, report = work / "source.jsonl", work / "prompts.jsonl", work / "report.json"
    # Written by a child so that this process stays small: a forked child's peak RSS starts at ours.
    writer = [sys.executable, __file__, "--write-only", str(src), "--rows", str(rows), "--dup-rate", str(dup_rate)]
    wall, *_ = run_child(writer)
    size = src.stat().st_size
    print(f"input: {rows} rows, {size / 2**20:.0f} MiB, written in {wall:.1f}s")
    _, _, base_rss, _ = run_child(prepare_argv("--help"))
    wall, cpu, rss, line = run_child(prepare_argv("--input", src, "--out", out, "--report", report))
    print(line)
    print(
        f"prepare: {rows / wall:,.0f} rows/s ({size / 2**20 / wall:.0f} MiB/s) over {wall:.1f}s wall; "
        f"{rows / cpu:,.0f} rows per CPU-second ({cpu:.1f}s CPU); "
        f"peak RSS {rss} MiB (start-up and imports alone: {base_rss} MiB)"
    )
    if with_exclude:
        again = work / "again.jsonl"
        wall, cpu, rss, line = run_child(prepare_argv("--input", src, "--out", again, "--exclude", out))
        print(line)
        print(
            f"prepare --exclude (all known): {rows / wall:,.0f} rows/s over {wall:.1f}s wall, "
            f"{cpu:.1f}s CPU, peak RSS {rss} MiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=650_000)
    parser.add_argument("--dup-rate", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path, help="keep the files here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="do not delete the temp dir")
    parser.add_argument("--with-exclude", action="store_true", help="also time an --exclude run")
    parser.add_argument("--write-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_only:
        write_source(args.write_only, args.rows, args.dup_rate)
        return
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        bench(args.workdir, args.rows, args.dup_rate, args.with_exclude)
        return
    tmp = tempfile.mkdtemp(prefix="prepare-bench-")
    try:
        bench(Path(tmp), args.rows, args.dup_rate, args.with_exclude)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", tmp], check=False)


if __name__ == "__main__":
    main()
