"""Which way `generate` runs, chosen here and nowhere else.

- single: one process holds the run directory's lock and runs the whole input (engine.single.run_single);
- claimer: one of any number of processes claiming the shards of a claimed-shard run directory
  (shards.run.run_claimer): with --join, --shards, or in a directory made with shards;
- supervisor: `--workers K` starts K claimer processes on this node and merges what they report
  (shards.workers.run_workers); each of them is a claimer started with --parent-fd.
"""

from __future__ import annotations

import asyncio

from .config import RunConfig
from .engine.single import run_single
from .engine.summary import Outcome
from .inputs.kinds import check_input
from .rundir.layout import made_for_run
from .shards.run import claimed, run_claimer
from .shards.workers import follow_parent, run_workers
from .tokens import TokenCounter


async def run_async(config: RunConfig, counter: TokenCounter | None = None, *, handle_signals: bool = True) -> Outcome:
    """Run `generate` in this process with an optional injected token counter (tests use a fake one).

    `handle_signals` installs the command's SIGINT/SIGTERM/SIGHUP handlers (a grace period, then a hard exit
    on the second); the Python API leaves them out, so a cancelled or interrupted call just stops.
    """
    check_input(config.input)
    with made_for_run(config.out):
        if claimed(config):  # claimed shards: many processes share the directory (shards/claims.py)
            return await run_claimer(config, counter, handle_signals)
        return await run_single(config, counter, handle_signals)


def run(config: RunConfig, counter: TokenCounter | None = None) -> Outcome:
    """Run `generate` to completion (or a clean stop) and return its summary and exit code."""
    return asyncio.run(run_async(config, counter))


def run_command(config: RunConfig, argv: list[str], parent_fd: int | None) -> Outcome:
    """`gen-pipeline generate`: a worker started by a supervisor (`parent_fd`: its pipe from the parent),
    the supervisor of `--workers K`, or this process alone."""
    if parent_fd is not None:
        follow_parent(parent_fd)  # a claimer that dies with its supervisor
    elif config.workers > 1:
        return run_workers(config, argv)
    return run(config)
