"""One `generate` run: prompts file -> validated rows -> token counts -> budgets -> balanced requests
-> one line in the output or the ledger. This is the only module that knows every other one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import __version__, cursor, health
from .balancer import ServerPool, ServerState
from .client import Client, open_transport
from .config import RunConfig
from .cursor import CursorKeeper, Mark, MarkTracker, Resumed, mark_of
from .dispatch import SampleDispatch, Sent, thinking_fields
from .errors import ConfigError, OutputError, PipelineError, PreflightError
from .findings import DRIFT_EVIDENCE, early_drift_problem
from .fleet import FleetInfo, discover
from .inputfile import check_input
from .locks import refuse_shard_writers
from .oversize import SizeFloor
from .pacing import queue_margin
from .progress import Progress, RunStats, format_summary, snapshot
from .records import TRANSIENT_REASONS, Completion, Failure, Prompt
from .requests import RequestPath
from .runtime import STOP_SIGNALS, say
from .samples import pending, row_reason
from .source import BadRow, PromptSource, Skipped, skipped
from .status import STATUS, write_status
from .store import (
    COMPLETIONS,
    SUMMARY,
    DirLock,
    ResumeState,
    RunWriter,
    check_manifest,
    repair_all,
    scan,
    write_json_atomic,
)
from .tokens import TemplateIdentity, TokenCounter, load_counter, template_identity
from .tokens.budget import OffsetLearner, dispatch_budget

log = logging.getLogger("gen_pipeline")
# File descriptors kept for everything but request sockets: output, ledger, input, index, tokenizer files,
# the event loop's own, worker pipes.
RESERVED_FILES = 64

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INCOMPLETE = 3
EXIT_OUTAGE = 4
EXIT_OUTPUT = 5
EXIT_INTERRUPTED = 130
STATUS_INTERVAL = 2.0
MAX_BATCH_ITEMS = 16384  # skipped rows one read tallies before it hands over
T = TypeVar("T")


@dataclass
class Outcome:
    """How a run ended."""

    summary: dict[str, Any]
    exit_code: int
    error: str | None = None  # why the output could not be written: one line for stderr


class BatchReader:
    """Reads, validates, resume-filters and counts rows a batch at a time, in a worker thread.

    With a `resumed` input cursor it starts at the cursor's mark, handing over the rows before it as
    one tally per reason.
    """

    def __init__(
        self,
        config: RunConfig,
        counter: TokenCounter,
        resume: ResumeState,
        stats: RunStats,
        resumed: Resumed | None = None,
        context_length: int | None = None,
        mine: Callable[[int], bool] | None = None,  # a claimer's held shards (else a static worker's shard)
    ) -> None:
        mine = mine or (config.mine if config.shard else None)
        start = resumed.start if resumed else None
        self.source = PromptSource(config.input, resume.rows(config.retry_failed), mine, start)
        self.carried = dict(resumed.tallies) if resumed else {}
        self.started = {"line": start.line, "bytes": start.offset} if start else None  # where reading began
        self.limit, self.system_prompt = config.limit, config.system_prompt
        self.items: Iterator[Prompt | BadRow | Skipped] = first_lines(self.source, self.limit)
        self.counter = counter
        self.resume = resume
        self.retry = config.retry_failed
        self.samples = config.samples
        self.batch = config.tokenize_batch
        self.name = config.input.name
        self.stats = stats
        # rows whose size alone puts them over this many input tokens are over_length without a count
        self.fit = context_length - config.safety_margin - config.min_tokens if context_length else None
        self.floor = SizeFloor(counter)

    def next_batch(self) -> tuple[list[Prompt | BadRow | Skipped], Mark]:
        """Up to `batch` rows that need a count, plus what was bad on the way and one Skipped per reason
        counting the rows skipped on the way (a resume skips 650k rows without handing over each); and
        the input position after them."""
        out: list[Prompt | BadRow] = []
        prompts: list[Prompt] = []
        tally, self.carried = self.carried, {}
        n_skipped = 0
        for item in self.items:
            settled = self._settle(item)
            if isinstance(settled, Skipped):
                tally[settled.reason] = tally.get(settled.reason, 0) + 1
                n_skipped += 1
                if n_skipped >= MAX_BATCH_ITEMS:
                    break  # a long settled stretch: hand it over, so progress moves
                continue
            out.append(settled)
            if isinstance(settled, Prompt):
                prompts.append(with_system_prompt(settled, self.system_prompt))
                if len(prompts) >= self.batch:
                    break
        self.stats.repeats = self.source.repeats
        self.stats.input_fraction = self.source.fraction()
        failed = self._count(prompts)
        counted: list[Prompt | BadRow | Skipped] = []
        for x in out:
            if id(x) in failed:
                assert isinstance(x, Prompt)
                self.source.note_bad(x.line, x.key)
                bad = self._settle(BadRow(x.line, failed[id(x)], x.id))
                if isinstance(bad, Skipped):  # ledgered by an earlier run: not written twice
                    tally[bad.reason] = tally.get(bad.reason, 0) + 1
                    continue
                x = bad
            counted.append(x)
        self._note_progress(sum(tally.values()) + len(counted))
        return [*(Skipped(reason, n) for reason, n in tally.items()), *counted], mark_of(self.source)

    def _note_progress(self, rows: int) -> None:
        """Tell the stats how many rows were handed over and how much of the input that was (for the ETA)."""
        fraction = self.source.fraction()  # of the compressed bytes, for a compressed file
        if self.limit is not None:
            fraction = max(fraction, self.source.lines / self.limit)
        self.stats.note_input(rows, 1.0 if rows == 0 else min(fraction, 1.0))

    def _settle(self, item: Prompt | BadRow | Skipped) -> Prompt | BadRow | Skipped:
        """A bad row an earlier run already ledgered is skipped (the source skips settled ids itself);
        a prompt gets the samples it still owes, and is skipped when it owes none."""
        if isinstance(item, BadRow):
            seen = (self.name, item.line) in self.resume.bad_lines
            return skipped("bad_input") if seen and "bad_input" not in self.retry else item
        if isinstance(item, Prompt):
            k = item.samples or self.samples
            item.pending = pending(self.resume, item.key, k, self.retry)
            if not item.pending:
                return skipped(row_reason(self.resume, item.key, k, self.retry) or "done")
        return item

    def _too_long(self, p: Prompt) -> bool:
        """Whether the row's size alone proves it over_length; then its input_tokens is that floor."""
        floor = self.floor.tokens_over(p.messages, self.fit) if self.fit is not None else None
        if floor is None:
            return False
        p.input_tokens, p.at_least = floor, True
        return True

    def _count(self, prompts: list[Prompt]) -> dict[int, str]:
        """Set each prompt's input_tokens; return why counting failed, by id() of the prompt."""
        failed: dict[int, str] = {}
        prompts = [p for p in prompts if not self._too_long(p)]
        counts = self.counter.count([p.messages for p in prompts]) if prompts else []
        for p, n in zip(prompts, counts, strict=True):
            if isinstance(n, int):
                p.input_tokens = n
            else:
                failed[id(p)] = n
        return failed


def first_lines(source: PromptSource, limit: int | None) -> Generator[Prompt | BadRow | Skipped, None, None]:
    """The source's items from its first `limit` lines (--limit; all of them when None)."""
    items = iter(source)
    if limit is None:
        yield from items
        return
    try:
        for item in items:
            if source.lines > limit:
                break
            yield item
            if source.lines >= limit:
                break
    finally:
        items.close()  # type: ignore[attr-defined]  # PromptSource.__iter__ is a generator


def with_system_prompt(prompt: Prompt, text: str | None) -> Prompt:
    """The row with `text` put first as a system turn, unless it has one already (--system-prompt)."""
    if text is not None and not any(m.get("role") == "system" for m in prompt.messages):
        prompt.messages = [{"role": "system", "content": text}, *prompt.messages]
    return prompt


@dataclass
class Runner:
    """Drives one run from an open run directory to its summary."""

    config: RunConfig
    counter: TokenCounter
    path: RequestPath
    pool: ServerPool
    writer: RunWriter
    resume: ResumeState
    stats: RunStats
    reader: BatchReader
    keeper: CursorKeeper | None = None  # None: no input cursor is written
    client: Client | None = None
    dispatch: SampleDispatch | None = None  # None: a plain SampleDispatch over `path`
    tracker: MarkTracker = field(default_factory=MarkTracker)
    warnings: list[str] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str = ""
    stop_code: int = 0  # the exit code the stop asks for
    fatal: PipelineError | None = None
    drift_judged: bool = False  # the first rows' token drift was judged (early_drift_problem)
    undispatched: int = 0  # prompts in the queue, not yet taken by a worker

    def request_stop(self, reason: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        """Stop dispatching; in-flight requests get the grace period to finish."""
        if not self.stopping.is_set():
            self.stop_reason, self.stop_code = reason, exit_code
            self.stopping.set()

    async def run(self) -> None:
        workers = self.pool.worker_count()
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue(maxsize=workers * 2)
        tasks = [asyncio.create_task(self._work(queue)) for _ in range(workers)]
        monitor = asyncio.create_task(self._monitor())
        prober = asyncio.create_task(health.watch(self.pool, self.client)) if self.client else monitor
        producer = asyncio.create_task(self._produce(queue, workers))
        try:
            await self._until_done_or_stopped(producer, tasks)
        finally:
            for t in [monitor, prober, producer, *tasks]:
                t.cancel()
            await asyncio.gather(monitor, prober, producer, *tasks, return_exceptions=True)

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
                batch, end = await loop.run_in_executor(pool, self.reader.next_batch)
                record = self.tracker.batch(end, [p.line for p in batch if isinstance(p, Prompt)])
                for item in batch:
                    if isinstance(item, Prompt):
                        self.stats.read += 1
                        self.undispatched += 1
                        await queue.put(item)
                    else:
                        self._settle_item(item)
                self.tracker.sealed(record)
                if not batch:
                    break
        self.pool.backlog = lambda: self.undispatched  # the input is exhausted: the tail begins
        for _ in range(workers):
            await queue.put(None)

    def _settle_item(self, item: BadRow | Skipped) -> None:
        """Rows that need no request: skipped (settled earlier; `count` of them) or bad input."""
        if isinstance(item, Skipped):
            self.stats.read += item.count
            self.stats.skipped[item.reason] += item.count
        else:
            self.stats.read += 1
            self._record_failure(Failure(item.id, item.line, "bad_input", item.detail))

    def _budget(self, p: Prompt) -> int | None:
        budget = dispatch_budget(
            self.config, self.path.context_length, p.input_tokens, p.max_tokens, self.path.learner.offset, p.at_least
        )
        if isinstance(budget, str):
            for s in p.pending or (0,):
                failure = Failure(p.id, p.line, "over_length", budget, input_tokens=p.input_tokens, sample=s)
                self._record_failure(failure)
            return None
        return budget

    async def _work(self, queue: asyncio.Queue[Prompt | None]) -> None:
        dispatch = self.dispatch or SampleDispatch(self.path, {}, self.warnings.append)
        while (prompt := await queue.get()) is not None:
            self.undispatched -= 1
            if self.stopping.is_set():
                continue  # not sent: the next run picks it up
            # Budgeted at dispatch, not at read time, so an offset learned meanwhile applies.
            budget = self._budget(prompt)
            if budget is None:
                self.tracker.settled(prompt.line)
                continue
            sent = await dispatch.generate(prompt, budget, prompt.pending or (0,))
            transient = False
            for outcome in sent.outcomes:
                if isinstance(outcome, Failure):
                    self._record_failure(outcome)
                    transient = transient or outcome.reason in TRANSIENT_REASONS
                else:
                    self._write(self.writer.write_completion, outcome)
                    self._count(outcome)
            self._count_usage(sent)
            if any(isinstance(o, Completion) for o in sent.outcomes):
                self.stats.input_tokens += prompt.input_tokens  # once: one request with n, or a cached prefix
            if transient:
                self.reader.source.logging = False  # the input cursor stops short of this row
            self.tracker.settled(prompt.line, ok=not transient)

    def _count_usage(self, sent: Sent) -> None:
        """Add the tokens the servers reported for one prompt's requests."""
        self.stats.output_tokens += sent.output_tokens
        if sent.reasoning_tokens is not None:
            self.stats.reasoning_tokens += sent.reasoning_tokens
            self.stats.reasoned_output_tokens += sent.output_tokens

    def _count(self, outcome: Completion) -> None:
        """Add one written completion to the run's figures."""
        self.stats.completed += 1
        self.stats.finish_reasons[str(outcome.finish_reason)] += 1
        if outcome.extra.get("truncated_in") == "reasoning":
            self.stats.truncated_in_reasoning += 1
        if outcome.prompt_tokens is not None:
            self.stats.drift[outcome.prompt_tokens - outcome.input_tokens] += 1
            if not self.drift_judged:
                self._judge_drift()

    def _judge_drift(self) -> None:
        """Stop, unless --force, when every one of the first rows compared drifted unlearnably."""
        if sum(self.stats.drift.values()) < DRIFT_EVIDENCE:
            return
        self.drift_judged = True
        problem = early_drift_problem(self.stats.drift, self.counter.name)
        if problem is None:
            return
        if self.config.force:
            self.warnings.append(f"PROBLEM ignored (--force): {problem}")
            return
        with contextlib.suppress(OSError):
            print(f"PROBLEM: {problem}", file=sys.stderr)
        self.request_stop(f"PROBLEM: {problem}", EXIT_ERROR)

    def _record_failure(self, failure: Failure) -> None:
        failure.source = self.config.input.name
        self._write(self.writer.write_failure, failure)
        self.stats.failed[failure.reason] += 1
        self.stats.last_error[failure.reason] = f"{failure.server or failure.source}: {failure.detail}"[:300]

    def _write(self, write: Any, record: Any) -> None:
        try:
            write(record)
        except OutputError as exc:
            self.fatal = exc
            self.request_stop(str(exc), EXIT_OUTPUT)
            raise

    def save_cursor(self) -> None:
        """Record how far the input is settled (the next run starts reading there)."""
        if self.keeper is not None and self.fatal is None:
            self.keeper.save(self.tracker.mark, self.reader.source)

    def write_status(self, state: str) -> None:
        """Replace status.json with a snapshot (a failure to write it never stops the run)."""
        with contextlib.suppress(OutputError):
            name = STATUS.replace(".json", f"{self.config.file_suffix}.json")
            write_status(self.config.out / name, snapshot(self.stats, self.pool.servers, state, self.pool.clock()))

    async def _monitor(self) -> None:
        progress = Progress(self.config.progress)
        last_status = 0.0
        try:
            while True:
                if time.monotonic() - last_status >= STATUS_INTERVAL:
                    last_status = time.monotonic()
                    self.write_status("stopping" if self.stopping.is_set() else "running")
                if self.keeper is not None and self.keeper.due():
                    self.save_cursor()
                outage = self.pool.outage_seconds()
                up = f"servers up {len(self.pool.healthy())}/{len(self.pool.servers)}"
                extra = f"ALL SERVERS DOWN for {outage:.0f} s, waiting" if outage else up
                progress.update(self.stats, extra)
                if outage > self.config.outage_timeout:
                    self.request_stop(f"no server usable for {outage:.0f} s (--outage-timeout)", EXIT_OUTAGE)
                await asyncio.sleep(0.5)
        finally:
            progress.update(self.stats)
            progress.close()


def _raise_first_failure(done: set[asyncio.Task[Any]]) -> None:
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def chat_template_hash(counter: TemplateIdentity) -> str | None:
    template = counter.chat_template
    return hashlib.sha256(str(template).encode()).hexdigest()[:16] if template else None


def manifest_for(config: RunConfig, model: str, ctx: int, counter: TemplateIdentity) -> dict[str, Any]:
    """The settings recorded with the run (never the API key)."""
    return {
        "model": model,
        "tokenizer": counter.name,
        "chat_template_sha256": chat_template_hash(counter),
        "context_length": ctx,
        "sampling": config.sampling,
        "max_tokens": config.max_tokens,
        "min_tokens": config.min_tokens,
        "safety_margin": config.safety_margin,
        "samples": config.samples,
        "thinking_budget": config.thinking_budget,
        "system_prompt": config.system_prompt,
        "servers": list(config.servers),
        "input": str(config.input),
        "gen_pipeline_version": __version__,
        **({"shards": config.shards} if config.shards is not None else {}),
    }


def resolve(config: RunConfig, fleet: FleetInfo) -> tuple[str, int, str]:
    """Model name, context length and tokenizer: the flags when given, else what the fleet says."""
    model = config.model or next(iter(sorted(fleet.models())), None)
    if not model:
        raise ConfigError("the servers report no model id; pass --model")
    contexts = fleet.context_lengths()
    ctx = config.context_length or (min(contexts) if contexts else None)
    if not ctx:
        raise ConfigError("the servers report no context length; pass --context-length")
    if config.context_length and contexts and config.context_length > min(contexts):
        fleet.warnings.append(
            f"--context-length {config.context_length} exceeds the smallest server context "
            f"{min(contexts)}; expect context 400s"
        )
    tokenizer = config.tokenizer or next((s.tokenizer_path for s in fleet.servers if s.tokenizer_path), None)
    if not tokenizer:
        raise ConfigError("the servers report no tokenizer_path; pass --tokenizer")
    return model, ctx, tokenizer


def build_pool(config: RunConfig, fleet: FleetInfo, open_files: int | None = None) -> ServerPool:
    """One slot per request each server runs at once; servers down at start begin out of service.

    Every request in flight holds a socket: when the servers take more than this process's open-file limit
    allows (`ulimit -n`, read when `open_files` is None), every server's share shrinks to fit, with a
    warning, instead of failing connections that would then be blamed on the servers.
    """
    reported = {s.url: s.max_running_requests for s in fleet.servers}
    wanted = {url: config.capacity_for(reported.get(url)) for url in config.servers}
    capacities, warning = fit_open_files(wanted, open_file_limit() if open_files is None else open_files)
    if warning is not None:
        fleet.warnings.append(warning)
        log.warning("%s", warning)
    margin = {url: _margin(config, reported.get(url), c, warning) for url, c in capacities.items()}
    pool = ServerPool(ServerState(url, capacity, margin[url]) for url, capacity in capacities.items())
    for server in pool.servers:
        if server.url in fleet.down:
            pool.mark_down(server)
    return pool


def _margin(config: RunConfig, reported: int | None, capacity: int, warning: str | None) -> int:
    """Requests to queue beyond `capacity`: only where the server's own running slots set it (it queues the
    rest), and none when open files are short."""
    if warning is not None:
        return 0
    if config.queue_margin is not None:
        return config.queue_margin
    return 0 if config.concurrency or reported is None else queue_margin(capacity)


def fit_open_files(capacities: dict[str, int], limit: int) -> tuple[dict[str, int], str | None]:
    """Each server's share of in-flight requests scaled down to fit `limit` open files, and the warning
    that says so (None when everything fits)."""
    sockets = max(len(capacities), limit - RESERVED_FILES)
    wanted = sum(capacities.values())
    if wanted <= sockets:
        return capacities, None
    fitted = {url: max(1, c * sockets // wanted) for url, c in capacities.items()}
    return fitted, (
        f"the servers take {wanted} requests at once but the open-file limit (ulimit -n) is {limit}: "
        f"keeping {sum(fitted.values())} in flight; raise the limit to use them all"
    )


def open_file_limit() -> int:
    """This process's soft limit on open files (sockets included); very large where there is none."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return 1 << 20
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _summary(runner: Runner, fleet: FleetInfo, exit_code: int) -> dict[str, Any]:
    s = runner.stats
    t = s.elapsed()
    return {
        "exit_code": exit_code,
        "stop_reason": runner.stop_reason or None,
        "read": s.read,
        "completed": s.completed,
        "skipped": dict(s.skipped),
        "failed": dict(s.failed),
        "repeats_dropped": s.repeats,
        "input_cursor": runner.reader.started,
        "requests": s.requests,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "elapsed_s": round(t, 2),
        "requests_per_s": round(s.completed / t, 2),
        "output_tokens_per_s": round(s.output_tokens / t, 1),
        "finish_reasons": dict(s.finish_reasons),
        "samples": runner.config.samples,
        "truncated_in_reasoning": s.truncated_in_reasoning,
        "reasoning_tokens": s.reasoning_view(),
        "token_drift": s.drift_view(),
        "learned_offset": runner.path.learner.offset,
        "servers": runner.pool.views(),
        "tail_s": None if (tail := runner.pool.tail_seconds()) is None else round(tail, 2),
        "warnings": fleet.warnings + runner.warnings,
    }


def _exit_code(runner: Runner) -> int:
    if runner.fatal is not None:
        return EXIT_OUTPUT
    if runner.stopping.is_set():
        return runner.stop_code
    return EXIT_INCOMPLETE if TRANSIENT_REASONS & runner.stats.failed.keys() else EXIT_OK


def _drift_warning(stats: RunStats) -> str | None:
    view = stats.drift_view()
    if view["differed"]:
        return (
            f"the server counted different prompt tokens than we did for {view['differed']} of "
            f"{view['compared']} rows {view['by_offset']}: the tokenizer or chat template is "
            "probably not the server's"
        )
    return None


def _over_length_advice(stats: RunStats) -> str | None:
    """Rows skipped as over_length on a count the servers contradict must not stay skipped unnoticed."""
    skipped = stats.failed.get("over_length", 0)
    if skipped and stats.drift_view()["differed"]:
        return (
            f"{skipped} row(s) were skipped as over_length on our token count, which the servers' counts "
            "contradict (see the drift warning): once --tokenizer matches the servers', run again with "
            "--retry-failed over_length to send them"
        )
    return None


def start_findings(config: RunConfig, fleet: FleetInfo) -> None:
    """Refuse, unless --force, a fleet `check` calls a PROBLEM; print the warnings now, not only at the end."""
    problems = fleet.problems()
    if problems and not config.force:
        raise PreflightError(problems)
    fleet.warnings.extend(f"PROBLEM ignored (--force): {p}" for p in problems)
    if config.shard is None:  # a worker's parent has printed them
        for warning in fleet.warnings:
            log.warning("warning: %s", warning)


def _install_signals(runner: Runner) -> Callable[[], None]:
    """SIGINT, SIGTERM and SIGHUP stop the run first, then say so (a closed stream cannot lose the stop); a
    second Ctrl-C exits at once. Returns what puts the handlers from before back."""
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    seen: list[str] = []

    def on_signal(signame: str) -> None:
        seen.append(signame)
        if len(seen) > 1:
            if signame != "SIGINT":
                return  # the same stop again: systemd signals the unit's group, and a wrapper passes it on too
            with contextlib.suppress(Exception):
                runner.writer.sync()
            os._exit(EXIT_INTERRUPTED)
        runner.request_stop(f"interrupted by {signame}")
        say(
            f"\n{signame}: stopping; in-flight requests get {runner.config.grace_period:.0f} s "
            "(press Ctrl-C again to exit now; the output stays resumable)"
        )

    def restore() -> None:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    return restore


async def run_async(config: RunConfig, counter: TokenCounter | None = None, *, handle_signals: bool = True) -> Outcome:
    """Run `generate` with an optional injected token counter (tests use a fake one).

    `handle_signals` installs the command's SIGINT/SIGTERM/SIGHUP handlers (a grace period, then a hard exit
    on the second); the Python API leaves them out, so a cancelled or interrupted call just stops.
    """
    if not config.input.is_file():
        raise ConfigError(f"input file not found: {config.input}")
    check_input(config.input)
    config.out.mkdir(parents=True, exist_ok=True)
    from . import claimrun

    if claimrun.claimed(config):  # claimed shards: many processes share the directory (claims.py)
        return await claimrun.run_claimer(config, counter, handle_signals)
    lock = DirLock(config.out)
    if config.shard is None:  # a worker process runs under its parent's lock (and holds its shard's)
        lock.acquire()
    try:
        if config.shard is None:  # an earlier --workers run's worker would write beside us
            await asyncio.to_thread(refuse_shard_writers, config.out)
        async with open_transport(config.api_key, config.http_client) as transport:
            return await _run_locked(config, Client(transport), counter, handle_signals)
    finally:
        lock.release()


async def settle_manifest(
    config: RunConfig, client: Client, counter: TokenCounter | None = None, during_load: Callable[[], T] | None = None
) -> tuple[FleetInfo, str, int, TokenCounter, T | None]:
    """Discover the fleet, load the tokenizer, and refuse (or record) the run's settings.

    `during_load()` (the resume scan) runs in another thread beside the tokenizer's load, and its result is
    returned. They take turns rather than overlap: tokenizers 0.23 holds the GIL for the whole load (~0.75 s
    for Qwen3's tokenizer.json; from_file, from_str and from_buffer alike), so only the scan's waits on the
    disk run beside it.
    """
    fleet = await discover(client, config.servers, config.startup_timeout)
    model, ctx, tokenizer = resolve(config, fleet)
    start_findings(config, fleet)
    background = asyncio.ensure_future(asyncio.to_thread(during_load)) if during_load is not None else None
    try:
        if counter is None:
            counter = await asyncio.to_thread(load_counter, tokenizer, config.tokenizer_loader)
        manifest = manifest_for(config, model, ctx, counter)
        check_manifest(config.out, manifest, config.force, write=config.shard is None)
        extra = await background if background is not None else None
    except BaseException:
        if background is not None:
            background.cancel()
        raise
    return fleet, model, ctx, counter, extra


async def settle_settings(config: RunConfig, client: Client) -> None:
    """settle_manifest for the parent of `--workers K`: the tokenizer's vocabulary is left to the workers."""
    fleet = await discover(client, config.servers, config.startup_timeout)
    model, ctx, tokenizer = resolve(config, fleet)
    start_findings(config, fleet)
    identity = await asyncio.to_thread(template_identity, tokenizer, config.tokenizer_loader)
    check_manifest(config.out, manifest_for(config, model, ctx, identity), config.force, write=True)


def resume_state(config: RunConfig) -> ResumeState:
    """What earlier runs settled; a worker reads only its own ids and leaves repairs to its parent."""
    worker = config.shard is not None
    state = scan(config.out, repair=False, mine=config.mine if worker else None)
    state.samples = config.samples
    return state


def resume_point(config: RunConfig) -> tuple[ResumeState, Resumed | None]:
    """What earlier runs settled, and the input cursor when it still holds (where reading starts).

    A --limit run reads from the top and keeps no cursor: its N lines are counted from the first.
    """
    state = resume_state(config)
    if config.limit is not None:
        return state, None
    return state, cursor.load(config.out, config.input, config.shard, config.retry_failed, state)


async def _run_locked(
    config: RunConfig, client: Client, counter: TokenCounter | None, handle_signals: bool = True
) -> Outcome:
    fleet, model, ctx, counter, point = await settle_manifest(config, client, counter, lambda: resume_point(config))
    assert point is not None
    resume, resumed = point
    extra = thinking_fields(config, fleet)  # refused here, before anything is opened or sent
    if config.shard is None and (torn := repair_all(config.out)):
        resume, resumed = resume_point(config)  # the scan read the torn tail as a corrupt line: again without it
        resume.torn_bytes = torn
    pool = build_pool(config, fleet)
    stats = RunStats()
    path = RequestPath(config, client, pool, model, ctx, OffsetLearner(), stats)
    found = resume.files.get(COMPLETIONS.replace(".jsonl", f"{config.file_suffix}.jsonl"))
    writer = RunWriter(config.out, config.fsync_interval, config.file_suffix, found)
    reader = BatchReader(config, counter, resume, stats, resumed, ctx)
    keeper = (
        None
        if config.limit is not None
        else cursor.CursorKeeper(config.out, config.input, config.shard, resumed, config.samples)
    )
    runner = Runner(config, counter, path, pool, writer, resume, stats, reader, keeper, client=client)
    runner.dispatch = SampleDispatch(path, extra, runner.warnings.append)
    if resume.corrupt_lines:
        runner.warnings.append(f"ignored {len(resume.corrupt_lines)} corrupt line(s): {resume.corrupt_lines[:5]}")
    if resume.torn_bytes:
        runner.warnings.append(f"moved a torn last line ({resume.torn_bytes} bytes) aside to *.torn")
    restore_signals = _install_signals(runner) if handle_signals else _nothing
    try:
        return await _run_loop(runner, fleet)
    finally:
        restore_signals()


def _nothing() -> None:
    """No signal handlers to put back (the Python API installs none)."""


async def _run_loop(runner: Runner, fleet: FleetInfo) -> Outcome:
    """Run until done or stopped, then write what the run leaves behind (cursor, status, summary)."""
    config, writer, stats = runner.config, runner.writer, runner.stats
    try:
        await runner.run()
    except OutputError:
        pass  # recorded in runner.fatal; what is on disk stays valid
    finally:
        writer.close()
        runner.save_cursor()
    for warning in (_drift_warning(stats), _over_length_advice(stats)):
        if warning is not None:
            runner.warnings.append(warning)
    exit_code = _exit_code(runner)
    summary = _summary(runner, fleet, exit_code)
    runner.write_status("finished")
    with contextlib.suppress(OutputError):
        write_json_atomic(config.out / SUMMARY.replace(".json", f"{config.file_suffix}.json"), summary)
    return Outcome(summary, exit_code, str(runner.fatal) if runner.fatal is not None else None)


def run(config: RunConfig, counter: TokenCounter | None = None) -> Outcome:
    """Run `generate` to completion (or a clean stop) and return its summary and exit code."""
    return asyncio.run(run_async(config, counter))


def describe(outcome: Outcome, config: RunConfig) -> str:
    """What to print at the end of a run."""
    text = format_summary(outcome.summary)
    if outcome.exit_code in (EXIT_INTERRUPTED, EXIT_OUTAGE, EXIT_INCOMPLETE, EXIT_OUTPUT):
        text += f"\nto resume, run the same command again (output in {config.out})"
    return text
