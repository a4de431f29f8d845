"""`generate` as a claimer of a claimed-shard run directory (the protocol: claims.py).

One claimer is one Runner over all its claims (feed.py): it claims a batch of free shards
(batch_size: half of an even split of them over the live claimers, at most V/16, so the run's last shards
go one at a time to whoever is free) and reads the input once for them; when
that read is over and its rows are handed out, it claims the next batch while the last requests are
still in flight, so the fleet never drains between claims. A claim whose prompts are all written or
ledgered is settled (unless one got a transient failure) and let go. The fleet, its balancer state, the
tokenizer and the learned token offset serve the whole run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any

import orjson

from ..config import RunConfig
from ..engine.assembly import Assembly
from ..engine.runner import Runner, final_exit_code, no_handlers, run_error, runner_summary
from ..engine.setup import retired_checkpoints, settle_manifest
from ..engine.summary import Outcome, merge_summaries
from ..errors import EXIT_INCOMPLETE, EXIT_OK, OutputError
from ..fleet.discovery import FleetInfo
from ..http import Client, open_transport
from ..inputs.kinds import input_fingerprint
from ..inputs.shape import RowShape
from ..progress.stats import RunStats
from ..rundir.layout import MANIFEST, SUMMARY, RunDir, write_json_atomic
from ..rundir.locks import refuse_shard_writers
from ..rundir.store import repair_all
from ..runtime import install_run_handlers
from ..tokens import TokenCounter
from .claims import Claimer, ShardTable, SharedRunLock, last_session, run_shards, shard_counts
from .feed import ClaimFeed, ClaimTracker, ClaimWriter


def claimed(config: RunConfig) -> bool:
    """Whether this `generate` runs as a claimer: --join, --shards, or a run directory made with shards."""
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
        async with open_transport(config.api_key, auth=config.server_auth) as transport:
            client = Client(transport, stream=config.loop_guard == "on")  # the loop guard reads answers streamed
            return await _claim_loop(config, client, counter, handle_signals)
    finally:
        lock.release()


def shard_table(config: RunConfig, reopen: bool = False) -> ShardTable:
    """The run's shards, settled for this input and samples count (more samples reopen them); `reopen`
    (--retry-failed): every shard open."""
    wanted = {**input_fingerprint(config.input), "samples": config.samples}
    return ShardTable(RunDir(config.out), int(config.shards or 1), wanted, reopen)


async def _claim_loop(config: RunConfig, client: Client, counter: TokenCounter | None, handle: bool) -> Outcome:
    fleet, model, ctx, counter, _ = await settle_manifest(config, client, counter)
    rundir = RunDir(config.out)
    table = shard_table(config, reopen=bool(config.retry_failed))
    claimer = Claimer(rundir)
    claimer.register()
    shape = RowShape.of(config.template, config.turns)
    await asyncio.to_thread(table.settle_empty, config.input, claimer.ident, shape)
    start = time.monotonic()
    try:
        stats = RunStats()
        writer = ClaimWriter(table.count, config.fsync_interval)
        stopping = asyncio.Event()  # the Runner's: set when it stops, so the feed claims nothing more
        feed = ClaimFeed(config, counter, stats, ctx, table, writer, stopping.is_set)
        feed.retired = retired_checkpoints(config, fleet)
        if not await asyncio.to_thread(feed.claim_next):
            summary, code, error = merge_summaries([], 0.0, EXIT_OK), EXIT_OK, None  # found nothing to claim
        else:
            runner, tracker = _runner(config, client, counter, fleet, model, ctx, feed, claimer, stopping)
            code = await _serve(runner, feed, tracker, handle)
            error = run_error(runner)
            summary = merge_summaries([runner_summary(runner, fleet, code)], time.monotonic() - start, code)
    finally:
        claimer.release()
    shards = shard_counts(table.count, table.open_shards(), table.held_by_others())
    summary.update(shards=shards, started=claimer.started, ended=time.time())
    with contextlib.suppress(OutputError):
        write_json_atomic(rundir.claimer(claimer.ident).summary, summary)
        write_json_atomic(rundir.root / SUMMARY, aggregate_summary(rundir, code))
    return Outcome(summary, code, error)


def _runner(
    config: RunConfig,
    client: Client,
    counter: TokenCounter,
    fleet: FleetInfo,
    model: str,
    ctx: int,
    feed: ClaimFeed,
    claimer: Claimer,
    stopping: asyncio.Event,
) -> tuple[Runner, ClaimTracker]:
    """The one Runner of a claimer (its pool and learned offset serve every claim), and its tracker."""
    parts = Assembly.build(config, client, counter, fleet, model, ctx, feed.stats)

    def may_settle() -> bool:
        # A write error (recorder.fatal) stops the run too, so `stopping` covers it.
        unread = feed.stats.input_error is not None  # a rerun reads it again, and says why it stops
        return not stopping.is_set() and config.limit is None and not unread

    def status_extra() -> dict[str, Any]:
        """Who this claimer is, in its status file: its claims, and "done" over all its passes."""
        return {"claimer": {**claimer.info(feed.shards()), "done_total": feed.stats.completed}}

    tracker = ClaimTracker(feed, claimer.ident, may_settle)
    status_path = claimer.rundir.claimer(claimer.ident).status
    runner = parts.runner(feed.writer, feed, tracker, None, status_path, status_extra, stopping)
    return runner, tracker


async def _serve(runner: Runner, feed: ClaimFeed, tracker: ClaimTracker, handle: bool) -> int:
    """Run every claim; let go of what is left (a stopped run's shards stay open); the exit code."""
    writer = feed.writer
    grace = runner.config.grace_period
    restore = install_run_handlers(runner.request_stop, writer.sync, grace) if handle else no_handlers
    try:
        with contextlib.suppress(OutputError):  # recorded in runner.fatal; what is on disk stays valid
            await runner.run()
    finally:
        tracker.settle_done()
        feed.release_all()
        writer.close()
        restore()
    if tracker.error is not None:
        raise tracker.error
    code = final_exit_code(runner)
    if code == EXIT_OK and writer.unsettled:
        code = EXIT_INCOMPLETE
    runner.write_status("finished")
    return code


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

    def span(p: dict[str, Any]) -> tuple[float, float]:
        end = float(p.get("ended") or 0.0)
        return float(p.get("started") or end - float(p.get("elapsed_s") or 0.0)), end

    parts = last_session(claimer_summaries(rundir), span)
    elapsed = max((span(p)[1] for p in parts), default=0.0) - min((span(p)[0] for p in parts), default=0.0)
    merged = merge_summaries(parts, elapsed, code)
    if code == EXIT_OK and merged["stop_reason"]:
        # the run ended well: a claimer's own stop (a Slurm task cancelled or requeued) did not stop it
        merged["warnings"].append(f"a claimer stopped early ({merged['stop_reason']}); the others went on")
        merged["stop_reason"] = None
    if parts:
        merged.update(started=min(span(p)[0] for p in parts), ended=max(span(p)[1] for p in parts))
    merged["claimers"] = merged.pop("workers")
    return merged
