"""`generate` as a claimer of a claimed-shard run directory (the protocol: claims.py).

One claimer reads the input once per pass and serves every shard it holds in that pass: it claims a
batch of open shards (batch_size: half of an even split over the live claimers, at most V/16, so the
run's last shards go one at a time to whoever is free), runs the ordinary pipeline over the rows of
those shards, marks each one settled that got no transient failure, lets go, and claims again. The
fleet, the tokenizer and the learned token offset are set up once and kept over the passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import orjson

from .claims import (
    Claim,
    Claimer,
    ClaimWriter,
    ShardTable,
    SharedRunLock,
    batch_size,
    input_fingerprint,
    live_claimers,
    run_shards,
)
from .config import RunConfig
from .dispatch import SampleDispatch, thinking_fields
from .errors import OutputError
from .fleet import FleetInfo
from .http import Client, open_transport
from .locks import refuse_shard_writers
from .pipeline import Runner, _exit_code, _nothing, runner_summary
from .progress import RunStats, snapshot
from .reader import BatchReader
from .requests import RequestPath
from .rundir import MANIFEST, SUMMARY, RunDir, write_json_atomic
from .runtime import install_run_handlers
from .setup import build_pool, settle_manifest
from .status import write_status
from .store import repair_all, scan
from .summary import Outcome, merge_summaries
from .tokens import TokenCounter
from .tokens.budget import OffsetLearner

EXIT_OK, EXIT_INCOMPLETE = 0, 3
SEVERITY = [1, 5, 4, 130, 3, 0]  # as workers.SEVERITY: the most serious exit code wins


def claimed(config: RunConfig) -> bool:
    """Whether this `generate` runs as a claimer: --join, --shards, or a run directory made with shards."""
    if config.shard is not None:
        return False  # a static worker of an earlier layout
    if config.join or config.shards is not None:
        return True
    with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError):
        return orjson.loads((config.out / MANIFEST).read_bytes()).get("shards") is not None
    return False


def with_shards(config: RunConfig) -> RunConfig:
    """The config with V settled: the run directory's, else --shards, else the default."""
    return dataclasses.replace(config, shards=run_shards(config.out / MANIFEST, config.shards))


async def run_claimer(config: RunConfig, counter: TokenCounter | None, handle_signals: bool) -> Outcome:
    """Take the run directory's shared lock, then claim and run shards until none is open to claim."""
    config = with_shards(config)
    lock = SharedRunLock(config.out, config.join)
    lock.acquire()
    try:
        await asyncio.to_thread(refuse_shard_writers, config.out)  # a static worker of an earlier run
        if not config.join:
            repair_all(config.out)  # the top-level files of an earlier layout: we are the only one here
        async with open_transport(config.api_key) as transport:
            return await _claim_loop(config, Client(transport), counter, handle_signals)
    finally:
        lock.release()


@dataclasses.dataclass
class ClaimRunner(Runner):
    """A Runner whose status file is its claimer's, naming the shards it holds."""

    claimer: Claimer | None = None
    held: tuple[int, ...] = ()
    done_before: int = 0  # rows completed in this process's earlier passes

    def write_status(self, state: str) -> None:
        """Replace claimers/ID.json with a snapshot plus who this claimer is."""
        assert self.claimer is not None
        doc = snapshot(self.stats, self.pool.servers, state, self.pool.clock())
        doc["claimer"] = {**self.claimer.info(self.held), "done_total": self.done_before + self.stats.completed}
        with contextlib.suppress(OutputError):
            write_status(self.claimer.rundir.claimer(self.claimer.ident).status, doc)


@dataclasses.dataclass
class Setup:
    """What a claimer sets up once and keeps over its passes."""

    config: RunConfig
    client: Client
    counter: TokenCounter
    fleet: FleetInfo
    model: str
    ctx: int
    extra: dict[str, Any]
    learner: OffsetLearner
    table: ShardTable
    claimer: Claimer


async def _claim_loop(config: RunConfig, client: Client, counter: TokenCounter | None, handle: bool) -> Outcome:
    fleet, model, ctx, counter, _ = await settle_manifest(config, client, counter)
    rundir = RunDir(config.out)
    wanted = {**input_fingerprint(config.input), "samples": config.samples}  # more samples reopen the shards
    table = ShardTable(rundir, int(config.shards or 1), wanted, bool(config.retry_failed))
    claimer = Claimer(rundir)
    claimer.register()
    await asyncio.to_thread(table.settle_empty, config.input, claimer.ident)
    setup = Setup(
        config, client, counter, fleet, model, ctx, thinking_fields(config, fleet), OffsetLearner(), table, claimer
    )
    parts: list[dict[str, Any]] = []
    tried: set[int] = set()  # shards this process left open (transient failures) are not taken again
    codes, start, done, error = [EXIT_OK], time.monotonic(), 0, None
    try:
        while True:
            free = [s for s in table.open_shards() if s not in tried]
            held = table.claim(batch_size(len(free), live_claimers(rundir), table.count), tried)
            if not held:
                break
            tried |= held.keys()
            try:
                runner, part = await _one_pass(setup, held, done, handle)
            finally:
                for c in held.values():
                    c.release()
            parts.append(part)
            done += runner.stats.completed
            codes.append(part["exit_code"])
            fatal = runner.recorder.fatal
            if runner.stopping.is_set() or fatal is not None:
                error = str(fatal) if fatal is not None else None
                break
            if part["exit_code"] == EXIT_OK and any(s in runner.writer.unsettled for s in held):  # type: ignore[attr-defined]
                codes.append(EXIT_INCOMPLETE)
    finally:
        claimer.release()
    code = next((c for c in SEVERITY if c in codes), 1)
    summary = merge_summaries(parts, time.monotonic() - start, code) if parts else _empty(code, table)
    summary.update(shards=shard_counts(table), started=claimer.started, ended=time.time())
    with contextlib.suppress(OutputError):
        write_json_atomic(rundir.claimer(claimer.ident).summary, summary)
        write_json_atomic(rundir.root / SUMMARY, aggregate_summary(rundir, code))
    return Outcome(summary, code, error)


async def _one_pass(
    setup: Setup, held: dict[int, Claim], done: int, handle: bool
) -> tuple[ClaimRunner, dict[str, Any]]:
    """One read of the input serving the shards in `held`; settles those that finished cleanly."""
    config, table = setup.config, setup.table

    def mine(key: int) -> bool:
        return key % table.count in held

    resume = scan(config.out, repair=False, mine=mine, shards=sorted(held))
    resume.samples = config.samples
    found = {s: resume.files.get(str(c.shard.writer.completions.relative_to(config.out))) for s, c in held.items()}
    pool = build_pool(config, setup.fleet)
    stats = RunStats()
    path = RequestPath(config, setup.client, pool, setup.model, setup.ctx, setup.learner, stats)
    writer = ClaimWriter(held, table.count, config.fsync_interval, found)
    reader = BatchReader(config, setup.counter, resume, stats, None, setup.ctx, mine=mine)
    runner = ClaimRunner(config, setup.counter, path, pool, writer, resume, stats, reader, None, client=setup.client)  # type: ignore[arg-type]
    runner.claimer, runner.held, runner.done_before = setup.claimer, tuple(sorted(held)), done
    runner.dispatch = SampleDispatch(path, setup.extra, runner.warnings.append)
    restore = install_run_handlers(runner.request_stop, writer.sync, config.grace_period) if handle else _nothing
    try:
        with contextlib.suppress(OutputError):  # recorded in runner.fatal; what is on disk stays valid
            await runner.run()
    finally:
        writer.close()
        restore()
    code = _exit_code(runner)
    if not runner.stopping.is_set() and runner.recorder.fatal is None and config.limit is None:
        for s in held:
            if s not in writer.unsettled:
                table.mark_settled(s, setup.claimer.ident)
    runner.write_status("finished")
    return runner, runner_summary(runner, setup.fleet, code)


def shard_counts(table: ShardTable) -> dict[str, int]:
    """Shards settled, claimed (held by a live process) and open (neither)."""
    open_ = table.open_shards()
    held = len(table.held_by_others())
    return {"count": table.count, "settled": table.count - len(open_), "claimed": held, "open": len(open_) - held}


def _empty(code: int, table: ShardTable) -> dict[str, Any]:
    """The summary of a claimer that found nothing to claim."""
    return merge_summaries([], 0.0, code)


def claimer_summaries(rundir: RunDir, since: float | None = None) -> list[dict[str, Any]]:
    """The claimers' summaries (those written since `since`, when given)."""
    parts = []
    for ident in rundir.claimers():
        path = rundir.claimer(ident).summary
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            if since is None or path.stat().st_mtime >= since:
                parts.append(orjson.loads(path.read_bytes()))
    return parts


def aggregate_summary(rundir: RunDir, code: int) -> dict[str, Any]:
    """summary.json: the summaries of this session's claimers (lifetimes that overlap, the newest group)
    added up, over the session's wall time: the first claimer's start to the last one's end."""
    from .claimstatus import last_session

    def span(p: dict[str, Any]) -> tuple[float, float]:
        end = float(p.get("ended") or 0.0)
        return float(p.get("started") or end - float(p.get("elapsed_s") or 0.0)), end

    parts = last_session(claimer_summaries(rundir), span)
    elapsed = max((span(p)[1] for p in parts), default=0.0) - min((span(p)[0] for p in parts), default=0.0)
    merged = merge_summaries(parts, elapsed, code)
    if parts:
        merged.update(started=min(span(p)[0] for p in parts), ended=max(span(p)[1] for p in parts))
    merged["claimers"] = merged.pop("workers")
    return merged


def manifest_shards(out: Path) -> int | None:
    """The run directory's V, or None for a run made without claimed shards."""
    try:
        return int(orjson.loads((out / MANIFEST).read_bytes())["shards"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
