"""The single-process mode: one process holds the run directory's lock and runs the whole input, its rows read
by one reader (reader.py), its outcomes written by the run directory's writer, and an input cursor kept (the
resume cursor, resume/cursor.py) unless --limit cuts the pass short.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..config import RunConfig
from ..errors import OutputError
from ..fleet.discovery import FleetInfo
from ..http import Client, open_transport
from ..progress.stats import RunStats
from ..resume import cursor
from ..resume.cursor import InputCursor, MarkTracker
from ..rundir.layout import RunDir, sweep_temporary_files, write_json_atomic
from ..rundir.locks import DirLock, refuse_shard_writers
from ..rundir.store import RunWriter, repair_all
from ..runtime import install_run_handlers
from ..tokens import TokenCounter
from ..tokens.findings import drift_warning, length_hint, over_length_advice, server_cut_warning
from .assembly import Assembly
from .reader import BatchReader
from .runner import Runner, final_exit_code, no_handlers, run_error, runner_summary
from .setup import resume_point, retired_checkpoints, settle_manifest
from .summary import Outcome


async def run_single(config: RunConfig, counter: TokenCounter | None, handle_signals: bool) -> Outcome:
    """The single-process mode: hold the run directory's lock, then run the whole input."""
    lock = DirLock(config.out)
    lock.acquire()
    try:
        await asyncio.to_thread(refuse_shard_writers, config.out)  # an older version's worker still writing
        sweep_temporary_files(config.out)  # a kill's, the directory being ours alone now
        async with open_transport(config.api_key, auth=config.server_auth) as transport:
            client = Client(transport, stream=config.loop_guard == "on")  # the loop guard reads answers streamed
            return await _run_locked(config, client, counter, handle_signals)
    finally:
        lock.release()


async def _run_locked(
    config: RunConfig, client: Client, counter: TokenCounter | None, handle_signals: bool = True
) -> Outcome:
    fleet, model, ctx, counter, point = await settle_manifest(config, client, counter, lambda: resume_point(config))
    assert point is not None
    resume, resumed = point
    parts = Assembly.build(config, client, counter, fleet, model, ctx, RunStats())  # refused before anything opens
    if torn := repair_all(config.out):
        resume, resumed = resume_point(config)  # the scan read the torn tail as a corrupt line: again without it
        resume.torn_bytes = torn
    found = resume.files.get(RunDir(config.out).writer().completions.name)
    writer = RunWriter(config.out, config.fsync_interval, found)
    reader = BatchReader(config, counter, resume, parts.stats, resumed, ctx, retired=retired_checkpoints(config, fleet))
    tracker = MarkTracker()
    keeper = (
        None if config.limit is not None else cursor.CursorKeeper(config.out, config.input, resumed, config.samples)
    )
    marks = None if keeper is None else InputCursor(keeper, tracker, reader.log)
    runner = parts.runner(writer, reader, tracker, marks)
    if resume.corrupt_lines:
        runner.warnings.append(f"ignored {len(resume.corrupt_lines)} corrupt line(s): {resume.corrupt_lines[:5]}")
    if resume.torn_bytes:
        runner.warnings.append(f"moved a torn last line ({resume.torn_bytes} bytes) aside to *.torn")
    if handle_signals:
        restore_signals = install_run_handlers(runner.request_stop, runner.sink.sync, config.grace_period)
    else:
        restore_signals = no_handlers
    try:
        return await _run_loop(runner, fleet)
    finally:
        restore_signals()


async def _run_loop(runner: Runner, fleet: FleetInfo) -> Outcome:
    """Run until done or stopped, then write what the run leaves behind (cursor, status, summary)."""
    config, writer, stats = runner.config, runner.sink, runner.stats
    try:
        await runner.run()
    except OutputError:
        pass  # recorded in runner.fatal; what is on disk stays valid
    finally:
        writer.close()
        runner.save_cursor()
    view, cut = stats.drift_view(), stats.server_cut
    warnings = drift_warning(view, stats.drift_shapes), over_length_advice(stats.failed, view), server_cut_warning(cut)
    for warning in (*warnings, length_hint(stats.finish_reasons, cut, config.max_tokens)):
        if warning is not None:
            runner.warnings.append(warning)
    exit_code = final_exit_code(runner)
    summary = runner_summary(runner, fleet, exit_code)
    runner.write_status("finished")
    with contextlib.suppress(OutputError):
        write_json_atomic(RunDir(config.out).writer().summary, summary)
    return Outcome(summary, exit_code, run_error(runner))
