"""Client performance: gen-pipeline vs a bare asyncio+aiohttp script, side by side in one run.

    python bench/perf.py [--rows 20000] [--big-rows 654676] [--skip-big]

`--workers 2` is measured too (CPU and RSS include both workers and the parent).
Workload (as in issue 7): 8 zero-latency simulated SGLang ports in a separate process, short chat prompts,
max_tokens 64, at most 256 requests in flight (32 per port). Printed, one table:
  - CPU ms/req: the client process's user+sys CPU divided by the rows it completed;
  - req/s: rows / wall time of the client process;
  - peak RSS (MB) of the client process;
  - for gen-pipeline only: exact Qwen3 chat-template counting, output and ledger on, as in production.
Then: tokenize + budget rate (prompts/s, in-process, batches of 256), and resume-ready time and peak RSS
on a 654,676-row input whose output already holds all but 1,000 rows (start to the first new line written).
The bare script counts nothing, budgets nothing, keeps no ledger and cannot resume.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simfleet import ENV, sim_process  # noqa: E402

from gen_pipeline.records import Completion  # noqa: E402
from gen_pipeline.sim import free_ports  # noqa: E402

QWEN3 = ROOT.parent / "shared" / "tokenizers" / "qwen3"
TOKENIZER = str(QWEN3) if (QWEN3 / "tokenizer.json").exists() else str(ROOT / "gen_pipeline/data/tiny-tokenizer")

BARE = r"""
import asyncio, itertools, json, sys
import aiohttp

async def main(inp, out, urls):
    rows = [json.loads(line) for line in open(inp)]
    ports = itertools.cycle(urls)
    sem = asyncio.Semaphore(256)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        with open(out, "w") as f:
            async def one(row):
                async with sem:
                    body = {"model": "m", "messages": row["messages"], "max_tokens": 64}
                    async with session.post(next(ports) + "/v1/chat/completions", json=body) as r:
                        data = await r.json()
                f.write(json.dumps({"id": row["id"], "completion": data["choices"][0]["message"]["content"]}) + "\n")
            await asyncio.gather(*(one(r) for r in rows))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3].split(",")))
"""


def short_rows(n: int) -> list[dict]:
    return [
        {"id": i, "messages": [{"role": "user", "content": f"Question {i}: what is {i} times {i % 97}?"}]}
        for i in range(n)
    ]


def write_jsonl(path: Path, rows) -> None:
    with path.open("wb") as f:
        for r in rows:
            f.write(orjson.dumps(r) + b"\n")


def timed(cmd: list[str]) -> dict[str, float]:
    """Run a command; return its wall time, user+sys CPU and peak RSS (from wait4)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    if status != 0:
        raise SystemExit(f"{cmd[:4]} failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else status}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def generate_cmd(inp: Path, out: Path, servers: str) -> list[str]:
    return [
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
        "--tokenizer",
        TOKENIZER,
        "--max-tokens",
        "64",
        "--concurrency",
        "32",
        "--progress",
        "off",
    ]


def tokenize_rate(rows: list[dict]) -> float:
    from gen_pipeline.config import RunConfig
    from gen_pipeline.tokens import load_tokenizer

    counter = load_tokenizer(TOKENIZER)
    config = RunConfig(input=Path("x"), out=Path("y"))
    start = time.monotonic()
    for i in range(0, len(rows), 256):
        batch = rows[i : i + 256]
        for n in counter.count([r["messages"] for r in batch]):
            config.budget(32768, int(n), None)
    return len(rows) / (time.monotonic() - start)


def big_resume(tmp: Path, servers: str, n: int) -> dict[str, float]:
    """Input of n rows, output holding all but the last 1,000: time to the first new line, and peak RSS."""
    inp, out = tmp / "big.jsonl", tmp / "big-out"
    out.mkdir()
    text = "Explain the following in detail, with examples and caveats: " + "caf\u00e9 context " * 40
    write_jsonl(
        inp,
        (
            {
                "id": f"r{i}",
                "conversations_id": i,
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"{i}: {text}"},
                ],
            }
            for i in range(n)
        ),
    )
    with (out / "completions.jsonl").open("wb") as f:
        for i in range(n - 1000):
            msgs = [{"role": "user", "content": f"{i}: {text}"}]
            f.write(Completion(f"r{i}", msgs, "ok " * 50, "stop", 90, 90, 50, 64, "s", 1, 0.1, "m", {}).to_line())
    size_mb = (inp.stat().st_size + (out / "completions.jsonl").stat().st_size) / 2**20
    cmd = generate_cmd(inp, out, servers)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done_bytes = (out / "completions.jsonl").stat().st_size
    ready = None
    while proc.poll() is None and ready is None:
        if (out / "completions.jsonl").stat().st_size > done_bytes:
            ready = time.monotonic() - start
        time.sleep(0.01)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"big resume failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else status}")
    return {
        "ready_s": ready or float("nan"),
        "rss_mb": usage.ru_maxrss / 1024,
        "files_mb": size_mb,
        "wall": time.monotonic() - start,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--big-rows", type=int, default=654676)
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-perf-"))
    rows = short_rows(args.rows)
    write_jsonl(tmp / "short.jsonl", rows)
    (tmp / "bare.py").write_text(BARE)
    ports = free_ports(8)
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    sim_flags = ("--max-running", "32", "--tokenizer", TOKENIZER, "--context-length", "32768")
    with sim_process(ports, *sim_flags):
        bare = timed([sys.executable, str(tmp / "bare.py"), str(tmp / "short.jsonl"), str(tmp / "bare.out"), urls])
        ours = timed(generate_cmd(tmp / "short.jsonl", tmp / "ours", servers))
        # wait4 counts the workers too: a parent's rusage includes the children it waited for
        ours2 = timed([*generate_cmd(tmp / "short.jsonl", tmp / "ours2", servers), "--workers", "2"])
        big = None if args.skip_big else big_resume(tmp, servers, args.big_rows)
    rate = tokenize_rate(rows)
    n = args.rows
    print(
        f"workload: {n} short chat prompts, max_tokens 64, 8 zero-latency ports, <=256 in flight; "
        f"tokenizer {Path(TOKENIZER).name}"
    )
    print(f"{'client':<22}{'CPU ms/req':>12}{'req/s':>10}{'peak RSS MB':>13}")
    for name, r in (("bare script", bare), ("gen-pipeline", ours), ("gen-pipeline -w 2", ours2)):
        print(f"{name:<22}{r['cpu'] / n * 1e3:>12.3f}{n / r['wall']:>10.0f}{r['rss_mb']:>13.0f}")
    print(
        f"ratios gen-pipeline/bare: CPU {ours['cpu'] / bare['cpu']:.2f}x, req/s {bare['wall'] / ours['wall']:.2f}x; "
        f"--workers 2 req/s {bare['wall'] / ours2['wall']:.2f}x"
    )
    print(f"tokenize + budget: {rate:,.0f} prompts/s (batches of 256, one thread)")
    if big:
        print(
            f"resume at {args.big_rows:,} rows ({big['files_mb']:.0f} MB input + output): first new line after "
            f"{big['ready_s']:.2f} s, peak RSS {big['rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
