"""What a running `generate` shows while it runs: the progress line and display (a bar or log lines),
status.json every STATUS_INTERVAL seconds, and the stop after --outage-timeout (the monitor task)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..errors import EXIT_ERROR, EXIT_OUTAGE, FleetRedeployedError
from .alerts import progress_text
from .display import Progress
from .stats import STATUS_INTERVAL, RunStats


def progress_line(stats: RunStats, extra: str = "") -> str:
    """The one line the progress bar or log shows: counts (each in the progress unit: rows, samples or
    turns) and rates, then `extra` (servers, alerts)."""
    t = stats.elapsed()
    dropped = [f"not sent {stats.work.dropped} (their conversation ended)"] if stats.work.dropped else []
    parts = [
        f"done {stats.completed}",
        f"skipped {stats.work.skipped_units()}",
        f"failed {sum(stats.failed.values())}",
        *dropped,
        f"in flight {stats.in_flight}",
        f"{stats.completed / t:.1f} req/s",
        f"{stats.output_tokens / t:.0f} out tok/s",
    ]
    return " | ".join(parts + ([extra] if extra else []))


def show(progress: Progress, stats: RunStats, extra: str = "") -> None:
    """Refresh the progress display from the run's counters."""
    progress.update(stats.settled(), progress_line(stats, extra), stats.work.total, stats.eta_rate())


async def watch_run(runner: Any) -> None:
    """While a Runner runs: the progress display, status.json every STATUS_INTERVAL, the input cursor when
    due, and the stop after --outage-timeout with no usable server, or at once with every server retired."""
    config, work = runner.config, runner.stats.work
    work.counts_for(config.turns, config.samples)
    progress = Progress(config.progress, work.unit)
    last_status = 0.0
    try:
        while True:
            if time.monotonic() - last_status >= STATUS_INTERVAL:
                last_status = time.monotonic()
                runner.write_status("stopping" if runner.stopping.is_set() else "running")
            if runner.cursor is not None and runner.cursor.due():
                runner.save_cursor()
            outage = runner.stats.outage_s = runner.pool.outage_seconds()
            up = f"servers up {len(runner.pool.healthy())}/{len(runner.pool.servers)}"
            extra = f"ALL SERVERS DOWN for {outage:.0f} s, waiting" if outage else up
            tail = runner.pool.in_tail  # the input is read: slow servers are left idle on purpose
            runner.alerts = runner.watch.check(runner.stats, runner.pool.servers, runner.pool.clock(), tail)
            extra += progress_text(runner.alerts)
            show(progress, runner.stats, extra)
            if runner.pool.all_retired():  # each came back from an outage as another checkpoint (fleet/prober.py)
                last = "a server came back from an outage serving another identity"
                runner.request_stop(str(FleetRedeployedError(last)), EXIT_ERROR)
            elif outage > runner.config.outage_timeout:
                runner.request_stop(f"no server usable for {outage:.0f} s (--outage-timeout)", EXIT_OUTAGE)
            await asyncio.sleep(0.5)
    finally:
        work.stop.set()  # the input's count, if still going, is no longer wanted
        if work.read_all and not runner.stopping.is_set():
            work.total = runner.stats.settled()  # the count was close; now the run has read every row
        show(progress, runner.stats)
        progress.close()
