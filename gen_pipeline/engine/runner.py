"""One process's `generate` run: prompts file -> validated rows -> token counts -> budgets -> balanced
requests -> one line in the output or the ledger. The Runner drives it, built by assembly.py for either mode:
the single-process mode (single.py: one writer holding the run directory's lock) or a claimer (shards/run.py);
modes.py chooses between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..config import RunConfig
from ..errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTAGE, EXIT_OUTPUT, OutputError
from ..fleet.affinity import fleet_cache_tokens
from ..fleet.balancer import ServerPool
from ..fleet.discovery import FleetInfo
from ..fleet.loads import watch_loads
from ..fleet.prober import watch_servers
from ..http import Client
from ..inputs.rows import BadRow
from ..inputs.source import Skipped
from ..progress import cost
from ..progress.alerts import Watch
from ..progress.live import watch_run
from ..progress.stats import RunStats, snapshot
from ..records import TRANSIENT_REASONS, Completion, Failure, Prompt, Rejected
from ..resume.cursor import InputCursor, Mark, MarkTracker
from ..rundir.layout import RunDir
from ..send.dispatch import SampleDispatch, Sent
from ..send.refusals import RefusalJudge, refused
from ..send.requests import RequestPath
from ..send.usage import usage_warnings
from ..tokens import TokenCounter
from .converse import TurnDispatch
from .metrics import exporting
from .reader import input_warnings
from .recorder import Recorder
from .summary import run_summary, write_status

log = logging.getLogger("gen_pipeline")


class Feed(Protocol):
    """Where a Runner's rows come from, read in its tokenizer thread: reader.BatchReader (one pass over the
    input) or shards.feed.ClaimFeed (a claimer's claims, one pass over the input each)."""

    @property
    def started(self) -> dict[str, int] | None:
        """Where reading began (summary.json's input_cursor); None: from the top."""

    def next_batch(self) -> tuple[list[Prompt | BadRow | Skipped], Mark]:
        """The next rows and where the read stands after them; an empty batch once there are no more."""

    def hold_cursor(self) -> None:
        """A row failed for a transient reason: an input cursor stops short of it (the next run reads it)."""


class Sink(Protocol):
    """Where a Runner's outcomes go: rundir.store.RunWriter (one directory's files) or shards.feed.ClaimWriter
    (each record to its shard's files)."""

    def write_completion(self, completion: Completion) -> None:
        """Append one completion line."""

    def write_failure(self, failure: Failure) -> None:
        """Append one ledger entry."""

    def write_rejected(self, rejected: Rejected) -> None:
        """Append one rejected answer (rejected.jsonl)."""

    def sync(self) -> None:
        """Flush and fsync what was written (a signal handler calls it)."""

    def close(self) -> None:
        """Close the files."""


class Tracker(Protocol):
    """Hears what was read and what is settled: resume.cursor.MarkTracker moves the input cursor's mark,
    shards.feed.ClaimTracker settles a claim once its prompts are all done."""

    def batch(self, end: Mark, lines: list[int]) -> Any:
        """A batch ending at `end` was read, with prompts at these lines; returns its record."""

    def sealed(self, record: Any) -> None:
        """The batch of `record` was handed to the workers."""

    def settled(self, line: int, ok: bool = True) -> None:
        """The prompt at `line` is written or ledgered (not `ok`: for a transient reason)."""


@dataclass
class Runner:
    """Drives one run from an open run directory to its summary: rows from its `feed`, outcomes to its
    `sink`, what is settled to its `tracker` (the three Protocols above)."""

    config: RunConfig
    counter: TokenCounter
    path: RequestPath
    pool: ServerPool
    sink: Sink
    stats: RunStats
    feed: Feed
    tracker: Tracker = field(default_factory=MarkTracker)
    cursor: InputCursor | None = None  # None: no input cursor is written
    client: Client | None = None
    dispatch: SampleDispatch | None = None  # None: a plain SampleDispatch over `path`
    status_path: Path | None = None  # where write_status writes (None: the run directory's status.json)
    status_extra: Callable[[], dict[str, Any]] | None = None  # more fields for each status snapshot
    turns: TurnDispatch | None = None  # --turns all: each prompt's conversations (use_turns)
    recorder: Recorder = field(init=False)
    sender: SampleDispatch = field(init=False)  # `dispatch`, or the plain one
    judge: RefusalJudge = field(init=False)  # holds back 400s until it is clear they are the rows' fault
    warnings: list[str] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str = ""
    stop_code: int = 0  # the exit code the stop asks for
    watch: Watch = field(init=False)  # the alerts status.json and the progress line show
    alerts: list[str] = field(default_factory=list)  # the alerts that held at the last look

    def __post_init__(self) -> None:
        self.recorder = Recorder(
            self.config, self.sink, self.stats, self.counter.name, self.request_stop, self.warnings
        )
        self.sender = self.dispatch or SampleDispatch(self.path, {}, self.warnings.append)
        self.sender.answers.keep = self.recorder.rejected  # each reject is written before its resample is sent
        self.judge = RefusalJudge(len(self.pool.servers), self._release, lambda r: self.request_stop(r, EXIT_OUTAGE))
        self.watch = Watch(self.config.stall_minutes * 60, self.config.on_stall, str(self.config.out))
        if self.config.turns == "all":
            self.use_turns()

    def use_turns(self) -> None:
        """--turns all: prompts are conversations, sent a turn at a time (converse.py)."""
        self.turns = TurnDispatch(self.sender, self.counter, self.recorder, self.stopping, self.judge)

    def request_stop(self, reason: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        """Stop dispatching; in-flight requests get the grace period to finish."""
        if not self.stopping.is_set():
            self.stop_reason, self.stop_code = reason, exit_code
            self.stopping.set()

    async def run(self) -> None:
        async with exporting(self.config, self.stats, self.pool) as exporter:
            await self._run()
            if exporter is not None and self.stop_code == EXIT_INTERRUPTED:
                exporter.linger = 0.0  # a Ctrl-C does not wait for a last scrape

    async def _run(self) -> None:
        workers = self.pool.worker_count()
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue(maxsize=workers * 2)
        tasks = [asyncio.create_task(self._work(queue)) for _ in range(workers)]
        monitor = asyncio.create_task(watch_run(self))
        prober = asyncio.create_task(watch_servers(self.pool, self.client)) if self.client else monitor
        # each watched server's capacity follows its load reports; never above its ceiling, so the workers sized
        # for the ceilings above stay enough
        loads = asyncio.create_task(watch_loads(self.pool, self.client, self.config.share)) if self.client else monitor
        producer = asyncio.create_task(self._produce(queue, workers))
        try:
            await self._until_done_or_stopped(producer, tasks)
            if not self.stopping.is_set():
                self.judge.finish()
        except BaseException:
            self.stopping.set()  # a task failed: nothing more is read or claimed (a claimer's feed waits on this)
            raise
        finally:
            for t in [monitor, prober, loads, producer, *tasks]:
                t.cancel()
            await asyncio.gather(monitor, prober, loads, producer, *tasks, return_exceptions=True)
            if self.turns is not None:
                self.turns.close()

    async def _until_done_or_stopped(self, producer: asyncio.Task[None], tasks: list[Any]) -> None:
        stop = asyncio.create_task(self.stopping.wait())
        work: set[asyncio.Task[Any]] = {producer, *tasks}
        try:
            while work and not self.stopping.is_set():
                done, work = await asyncio.wait(work | {stop}, return_when=asyncio.FIRST_COMPLETED)
                work.discard(stop)
                _raise_first_failure(done - {stop})
            if work:
                producer.cancel()
                await self._drain(work)
        finally:
            stop.cancel()

    async def _drain(self, work: set[asyncio.Task[Any]]) -> None:
        """Give in-flight requests the grace period; nothing new is sent."""
        deadline = time.monotonic() + self.config.grace_period
        while self.stats.in_flight and time.monotonic() < deadline:
            if all(t.done() for t in work):
                break
            await asyncio.sleep(0.05)
        _raise_first_failure({t for t in work if t.done()})

    async def _produce(self, queue: asyncio.Queue[Prompt | None], workers: int) -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
            while not self.stopping.is_set():
                batch, end = await loop.run_in_executor(pool, self.feed.next_batch)
                record = self.tracker.batch(end, [p.line for p in batch if isinstance(p, Prompt)])
                for item in batch:
                    if isinstance(item, Prompt):
                        self.stats.read += 1
                        self.stats.undispatched += 1
                        if self.turns is not None:
                            self.turns.owe(item)
                        await queue.put(item)
                    else:
                        self.recorder.unsent(item)
                self.tracker.sealed(record)
                if not batch:
                    break
        if self.turns is None:
            self.pool.begin_tail(lambda: self.stats.undispatched)  # the input is exhausted
        for _ in range(workers):
            await queue.put(None)
        if self.turns is not None:  # conversations read are far from done: the tail begins with their last turns
            await self.turns.until_tail(self.pool)

    def _budget(self, p: Prompt) -> int | None:
        budget = self.path.budget(p)
        if isinstance(budget, str):
            for s in p.pending or (0,):
                failure = Failure(p.id, p.line, "over_length", budget, input_tokens=p.input_tokens, sample=s)
                failure.restart = p.restart.get(s, 0)  # a row answered again (--redo-changed): its generation's
                self.recorder.failure(failure)
            return None
        return budget

    async def _work(self, queue: asyncio.Queue[Prompt | None]) -> None:
        while (prompt := await queue.get()) is not None:
            self.stats.undispatched -= 1
            if self.stopping.is_set():
                continue  # not sent: the next run picks it up
            transient = await (self._converse(prompt) if self.turns is not None else self._send(prompt, self.sender))
            if transient is not None:  # None: not settled here (the judge's to settle, or the next run's)
                self._settle(prompt, transient)

    def _settle(self, prompt: Prompt, transient: bool) -> None:
        """A written prompt for the input cursor: passed, or (transient) held before."""
        if transient:
            self.feed.hold_cursor()
        self.tracker.settled(prompt.line, ok=not transient)

    def _release(self, prompt: Prompt, sent: Sent) -> None:
        """Write and settle a prompt the refusal judge held back (its 400 was the row's fault)."""
        self._settle(prompt, self.recorder.sent(prompt, sent))

    async def _send(self, prompt: Prompt, dispatch: SampleDispatch) -> bool | None:
        """The samples one prompt owes: True when one failed for a transient reason (None: not sent)."""
        # Budgeted at dispatch, not at read time, so an offset learned meanwhile applies.
        budget = self._budget(prompt)
        if budget is None:
            return False
        sent = await dispatch.generate(prompt, budget, prompt.pending or (0,))
        return None if self.judge.hold(prompt, sent) else self.recorder.sent(prompt, sent)

    async def _converse(self, prompt: Prompt) -> bool | None:
        """--turns all: the conversations one prompt owes, each budgeted turn by turn; None when the run
        stopped before they settled."""
        assert self.turns is not None
        end, sent = await self.turns.run(prompt)
        if end == "stopped":  # unsettled; its refusals are the judge's to write, and it writes none on a stop
            if sent.outcomes and refused(sent) is None:
                self.recorder.sent(prompt, sent)
            return None
        if not sent.outcomes:
            return False
        return None if self.judge.hold(prompt, sent) else self.recorder.sent(prompt, sent)

    def save_cursor(self) -> None:
        """Record how far the input is settled (the next run starts reading there)."""
        if self.cursor is not None and self.recorder.fatal is None:
            self.cursor.save()

    def write_status(self, state: str) -> None:
        """Replace the status file with a snapshot (a failure to write it never stops the run)."""
        doc = snapshot(self.stats, self.pool.servers, state, self.pool.clock(), self.alerts)
        if self.status_extra is not None:
            doc.update(self.status_extra())
        with contextlib.suppress(OutputError):
            write_status(self.status_path or RunDir(self.config.out).writer().status, doc)


def thinking_warning(runner: Runner) -> str | None:
    """What the summary says when answers thought past --thinking-budget: the servers did not enforce it."""
    over, stats = runner.stats.over_thinking_budget, runner.stats
    if not over:
        return None
    return (
        f"{over} answer(s) thought past --thinking-budget {runner.config.thinking_budget} (up to "
        f"{stats.most_thinking} reasoning tokens): the servers do not enforce it (SGLang 0.5.23's chat API takes "
        "a thinking budget only with a custom logit processor or a grammar); cap the answers with --max-tokens, "
        "or turn thinking off with --chat-template-kwargs"
    )


def runner_summary(runner: Runner, fleet: FleetInfo, exit_code: int) -> dict[str, Any]:
    """summary.json of one Runner: its figures (summary.run_summary) and what only the Runner knows."""
    warnings = fleet.warnings + runner.warnings + input_warnings(runner.config, runner.stats)
    warnings += usage_warnings(runner.pool.servers)
    # the caches of the servers that served (one down all run held nothing: check counts those that answer)
    served = [s for s in runner.pool.servers if s.requests] or runner.pool.servers
    caches = fleet_cache_tokens(s.prefixes.pool_tokens for s in served)
    late = [runner.stats.same_samples.warning(), runner.stats.scatter.warning(caches), thinking_warning(runner)]
    late += [runner.stats.restart_warning(), runner.stats.changed.warning()]
    warnings += [w for w in late if w is not None] + runner.watch.cpu_warnings(runner.stats.elapsed())
    summary = run_summary(runner.stats, runner.pool, exit_code, warnings)
    summary.update(
        stop_reason=runner.stop_reason or None,
        input_cursor=runner.feed.started,
        samples=runner.config.samples,
        learned_offset=runner.path.learner.offset,
    )
    summary.update(cost.run_cost(summary, runner.stats.elapsed(), len(runner.pool.servers), runner.config))
    return summary


def _raise_first_failure(done: set[asyncio.Task[Any]]) -> None:
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def final_exit_code(runner: Runner) -> int:
    """The exit code a finished or stopped Runner ends with."""
    if runner.recorder.fatal is not None:
        return EXIT_OUTPUT
    if runner.stopping.is_set():
        return runner.stop_code
    if runner.stats.input_error is not None:
        return EXIT_ERROR  # every readable row is settled; the rest of the input cannot be read
    incomplete = TRANSIENT_REASONS & runner.stats.failed.keys() or runner.stats.unfinished_line is not None
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def run_error(runner: Runner) -> str | None:
    """The one line for stderr: why the output could not be written, or the input not read to its end."""
    fatal = runner.recorder.fatal
    return str(fatal) if fatal is not None else runner.stats.input_error


def no_handlers() -> None:
    """No signal handlers to put back (the Python API installs none)."""
