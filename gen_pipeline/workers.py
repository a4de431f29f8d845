"""`generate --workers K`: K worker processes, each owning the rows whose id hash falls in its shard.

The parent holds the directory lock, settles the manifest, repairs torn tails, then starts
`gen-pipeline generate ... --shard i/K` K times. Worker i writes completions-0000i.jsonl,
failures-0000i.jsonl, status-0000i.json and summary-0000i.json and takes 1/K of each server's capacity.
Resume reads every shard file, so a run may be resumed with any K. Signals go to the parent, which
passes them on once (the workers run in their own process groups, so Ctrl-C is not delivered twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import orjson

from .config import RunConfig
from .http import Client, open_transport
from .pipeline import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTAGE, EXIT_OUTPUT, Outcome
from .status import STATUS
from .store import SUMMARY, DirLock, repair_all, write_json_atomic

# The exit code of the whole run is the most serious of the workers'.
SEVERITY = [EXIT_ERROR, EXIT_OUTPUT, EXIT_OUTAGE, EXIT_INTERRUPTED, EXIT_INCOMPLETE, EXIT_OK]
COUNTERS = ("read", "completed", "requests", "repeats_dropped", "input_tokens", "output_tokens")
TALLIES = ("skipped", "failed", "finish_reasons")


def worker_argv(argv: list[str], index: int, count: int) -> list[str]:
    """The command line of worker `index`: the user's, plus its shard and no progress display."""
    return [sys.executable, "-m", "gen_pipeline", *argv, "--shard", f"{index}/{count}", "--progress", "off"]


def merged_exit_code(codes: list[int]) -> int:
    """The most serious exit code; a worker killed by a signal counts as interrupted."""
    known = [c if c >= 0 else EXIT_INTERRUPTED for c in codes]
    return next((c for c in SEVERITY if c in known), EXIT_ERROR)


def merge_summaries(parts: list[dict[str, Any]], elapsed: float, exit_code: int) -> dict[str, Any]:
    """One summary from the workers' summaries."""
    merged: dict[str, Any] = {k: sum(p.get(k, 0) for p in parts) for k in COUNTERS}
    for key in TALLIES:
        merged[key] = dict(sum((Counter(p.get(key, {})) for p in parts), Counter()))
    drift: Counter[str] = sum((Counter(p["token_drift"]["by_offset"]) for p in parts if "token_drift" in p), Counter())
    merged["token_drift"] = {
        "compared": sum(p.get("token_drift", {}).get("compared", 0) for p in parts),
        "differed": sum(drift.values()),
        "by_offset": dict(drift),
    }
    merged["servers"] = _merge_servers([p.get("servers", {}) for p in parts])
    merged.update(
        exit_code=exit_code,
        workers=len(parts),
        stop_reason="; ".join(sorted({p["stop_reason"] for p in parts if p.get("stop_reason")})) or None,
        elapsed_s=round(elapsed, 2),
        requests_per_s=round(merged["completed"] / max(elapsed, 1e-9), 2),
        output_tokens_per_s=round(merged["output_tokens"] / max(elapsed, 1e-9), 1),
        learned_offset=max((p.get("learned_offset", 0) for p in parts), default=0),
        # each worker keeps its own cursor; the merged one is where every worker's reading began
        input_cursor=min((p["input_cursor"] for p in parts), key=lambda c: c["line"])
        if parts and all(p.get("input_cursor") for p in parts)
        else None,
        warnings=sorted({w for p in parts for w in p.get("warnings", [])}),
    )
    return merged


def _merge_servers(views: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for view in views:
        for url, v in view.items():
            m = out.setdefault(url, {"requests": 0, "completions": 0, "failures": Counter(), "output_tokens": 0,
                                     "capacity": 0, "out_of_service_s": 0.0, "mean_latency_s": None})  # fmt: skip
            for k in ("requests", "completions", "output_tokens", "capacity"):
                m[k] += v.get(k) or 0
            m["failures"] += Counter(v.get("failures") or {})
            m["out_of_service_s"] = max(m["out_of_service_s"], v.get("out_of_service_s") or 0.0)
            if v.get("mean_latency_s") is not None:
                m["mean_latency_s"] = max(m["mean_latency_s"] or 0.0, v["mean_latency_s"])
    for m in out.values():
        m["failures"] = dict(m["failures"])
    return out


async def _settle(config: RunConfig) -> None:
    from .pipeline import settle_settings

    async with open_transport(config.api_key) as transport:
        await settle_settings(config, Client(transport))


def run_workers(config: RunConfig, argv: list[str]) -> Outcome:
    """Run `config.workers` worker processes over the input and merge what they report."""
    if not config.input.is_file():
        from .errors import ConfigError

        raise ConfigError(f"input file not found: {config.input}")
    config.out.mkdir(parents=True, exist_ok=True)
    lock = DirLock(config.out)
    lock.acquire()
    try:
        asyncio.run(_settle(config))  # refuse a changed manifest before any worker starts
        repair_all(config.out)
        return _supervise(config, argv)
    finally:
        lock.release()


def _supervise(config: RunConfig, argv: list[str]) -> Outcome:
    k, start = config.workers, time.monotonic()
    for pattern in (SUMMARY.replace(".json", "-*.json"), STATUS.replace(".json", "-*.json")):
        for stale in config.out.glob(pattern):
            stale.unlink()  # a worker that dies early must not be reported with an old run's figures
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    procs = [subprocess.Popen(worker_argv(argv, i, k), env=env, stdout=subprocess.DEVNULL, start_new_session=True)
             for i in range(k)]  # fmt: skip

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        codes = [p.wait() for p in procs]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    parts = [_read_summary(config, i) for i in range(k)]
    exit_code = merged_exit_code(codes)
    summary = merge_summaries([p for p in parts if p], time.monotonic() - start, exit_code)
    lost = [f"worker {i} (exit {codes[i]})" for i, part in enumerate(parts) if part is None]
    if lost:  # it died before its summary: its error is on stderr above, its rows are not counted here
        summary["warnings"].append(f"no summary from {', '.join(lost)}; see the errors above")
    write_json_atomic(config.out / SUMMARY, summary)
    return Outcome(summary, exit_code)


def _read_summary(config: RunConfig, index: int) -> dict[str, Any] | None:
    path = config.out / SUMMARY.replace(".json", f"-{index:05d}.json")
    try:
        return dict(orjson.loads(path.read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return None
