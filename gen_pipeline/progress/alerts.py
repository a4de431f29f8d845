"""Alerts that need no dashboard: what `status` and the progress line flag while a run goes on.

A Watch looks at the run's own counters (RunStats, the servers' states) each time the monitor asks, on the
clock it is given, and keeps the little history its judgements need:
- a server that got no request for IDLE_S while others were busy;
- a server whose share of the work stays far below its share of the fleet's slots (SHARE_FLOOR), before the
  run's tail (where the balancer keeps slow servers idle on purpose);
- token-count drift that appears after the run's first rows agreed with the servers' counts;
- a prefix-cache hit share that collapsed (the recent share under CACHE_FLOOR of the run's earlier one);
- the client at its CPU limit: its Python threads used CLIENT_BUSY of a core or more over the recent window,
  before the run's tail. They share one interpreter lock, so together they have one core: at that point the
  client, not the servers, sets the pace, and more `--workers` processes are the way past it (the tokenizer's
  own native threads, which encode without that lock, are not counted). Or the client short of a CPU: its
  Python threads ran and waited for one (runnable, not running: Linux's schedstat) CLIENT_BUSY of the time
  together, waiting CLIENT_STARVED of it or more: other work on the machine holds the cores it needs, and
  more processes would not help. `limited_s` and `starved_s` add up the time judged so, for the end-of-run
  warnings (`cpu_warnings`);
- the answers rejected (send/resample.py) by a server, or by the run, jumping: over the last REJECT_WINDOW_S at
  least REJECT_HIGH of them, or REJECT_FLOOR and REJECT_JUMP times the share before (a broken chat template, a
  checkpoint that loops), once REJECT_EVIDENCE answers were judged in that time;
- a stall: no completion for --stall-minutes. `--on-stall CMD` runs CMD once per stall (through the
  shell, not waited for), with the alert in $GEN_PIPELINE_ALERT and the run directory in $GEN_PIPELINE_OUT.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from ..config import API_KEY_ENV, SERVER_AUTH_ENV
from .display import duration

log = logging.getLogger("gen_pipeline")

IDLE_S = 600.0  # a server without a request this long, while others are busy
SAMPLE_S = 5.0  # seconds between the samples the windowed judgements are made of
WINDOW_S = 300.0  # the recent window of the share and cache judgements
MIN_WINDOW_S = 60.0  # judged only once the window spans this much
SHARE_FLOOR = 0.25  # a server busy under this fraction of the fleet's busy share is flagged
BUSY_FLEET = 0.5  # ...when the fleet's slots are at least this busy
CLEAN_ROWS = 32  # drift "appears mid-run" when at least this many rows agreed before any differed
CACHE_FLOOR = 0.25  # the recent cache-hit share under this fraction of the earlier one has collapsed
MIN_CACHE_SHARE = 0.2  # ...of an earlier share at least this large
DEFAULT_STALL_MINUTES = 10.0
CLIENT_BUSY = 0.9  # the Python threads' CPU seconds per second at which the client is at its limit
CLIENT_STARVED = 0.2  # ...or, with the time they waited for a CPU, when they waited at least this share
LIMITED_WARN_S = 60.0  # the end-of-run warning: at the limit at least this long...
LIMITED_WARN_SHARE = 0.1  # ...and for at least this share of the run
REJECT_WINDOW_S = 60.0  # the recent time whose reject share is compared with the run's before it
REJECT_EVIDENCE = 20  # answers judged in it before its reject share is judged
REJECT_HIGH = 0.5  # a recent reject share this high is flagged whatever it was before
REJECT_FLOOR = 0.2  # ...and one this high when it is also
REJECT_JUMP = 3.0  # ...this many times the share before the window
RUN = ""  # Sample.answers' key for the whole run


def run_command(command: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start `command` through the shell, detached from the run's terminal and signals. It gets the run's
    environment without the servers' secrets a `--workers` claimer is handed there (a hook needs none)."""
    inherited = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, SERVER_AUTH_ENV)}
    return subprocess.Popen(
        command, shell=True, env={**inherited, **env}, stdin=subprocess.DEVNULL, start_new_session=True
    )


def progress_text(alerts: list[str]) -> str:
    """What the progress line adds: the first alert and how many more `status` shows ("" for none)."""
    if not alerts:
        return ""
    more = f" (+{len(alerts) - 1} more: gen-pipeline status)" if len(alerts) > 1 else ""
    return f" | ALERT: {alerts[0]}{more}"


class CPU(NamedTuple):
    """What the Python threads of this process had of the machine's CPUs, in seconds."""

    ran: float  # on a CPU
    waited: float = 0.0  # runnable, waiting for a CPU (0 where the system does not say)


class Sample(NamedTuple):
    """What the windowed judgements are made of, every SAMPLE_S."""

    at: float
    load: dict[str, tuple[int, int]]  # server: (in flight, capacity)
    cached_tokens: int
    prompt_tokens: int
    cpu: CPU  # the Python threads' CPU so far
    answers: dict[str, tuple[int, int]] = {}  # noqa: RUF012  # server (RUN: the run): (answers, rejected) so far


class Watch:
    """The run's alerts, judged at each `check`; runs --on-stall's command once per stall."""

    def __init__(
        self,
        stall_s: float = DEFAULT_STALL_MINUTES * 60,
        on_stall: str | None = None,
        out: str = "",
        start: Callable[[str, dict[str, str]], Any] = run_command,
        cpu: Callable[[], CPU] | None = None,
    ) -> None:
        self.stall_s, self.on_stall, self.out, self.start = stall_s, on_stall, out, start
        self.cpu = cpu or python_cpu
        self.started: float | None = None
        self.completed, self.last_completion = -1, 0.0
        self.stalled = False
        self.clean_rows = 0  # rows compared, all agreeing, before the first that differed
        self.samples: deque[Sample] = deque()
        self.limited_s = 0.0  # time between samples at the CPU limit, outside the tail
        self.starved_s = 0.0  # time between samples short of a CPU, outside the tail
        self.children: list[Any] = []

    def check(self, stats: Any, servers: list[Any], now: float, tail: bool = False) -> list[str]:
        """The alerts that hold now (one line each). In the `tail` (the input read to its end) the balancer
        keeps slow servers idle on purpose: shares are not judged."""
        if self.started is None:
            self.started = self.last_completion = now
        servers = [s for s in servers if not getattr(s, "retired", False)]  # left out on purpose, for good
        self._sample(stats, servers, now, tail)
        judged = [] if tail else [*self._shares(), *self._cpu_limit()]
        alerts = [*self._idle(servers, now), *judged, *self._drift(stats), *self._cache(), *self._rejects()]
        stall = self._stall(stats, now)
        self.children = [c for c in self.children if c.poll() is None]  # reap finished commands
        return [*([stall] if stall else []), *alerts]

    def _sample(self, stats: Any, servers: list[Any], now: float, tail: bool) -> None:
        if self.samples and now - self.samples[-1].at < SAMPLE_S:
            return
        load = {s.url: (s.in_flight, s.capacity) for s in servers}
        answers = {s.url: (s.completions, sum(s.rejects.values())) for s in servers}
        answers[RUN] = (stats.answers, sum(stats.rejects.values()))
        sample = Sample(now, load, stats.cached_tokens, stats.input_tokens, self.cpu(), answers)
        if self.samples and not tail:
            ran, waited = _cpu_shares(self.samples[-1], sample)
            self.limited_s += (now - self.samples[-1].at) * (ran >= CLIENT_BUSY)
            self.starved_s += (now - self.samples[-1].at) * _starved(ran, waited)
        self.samples.append(sample)
        while len(self.samples) > 2 and now - self.samples[1].at >= WINDOW_S:
            self.samples.popleft()

    def _idle(self, servers: list[Any], now: float) -> list[str]:
        assert self.started is not None
        busy = [s for s in servers if s.in_flight > 0]
        alerts = []
        for s in servers:
            idle = now - max(s.last_sent, self.started)
            if idle >= IDLE_S and any(o is not s for o in busy):
                alerts.append(f"{s.url} got no request for {duration(idle)} while others were busy")
        return alerts

    def _window(self) -> bool:
        return len(self.samples) > 1 and self.samples[-1].at - self.samples[0].at >= MIN_WINDOW_S

    def _shares(self) -> list[str]:
        """Servers whose slots stayed far emptier than the fleet's over the recent window."""
        if not self._window():
            return []
        used: dict[str, list[int]] = {}
        for sample in self.samples:
            for url, (flight, capacity) in sample.load.items():
                totals = used.setdefault(url, [0, 0])
                totals[0] += flight
                totals[1] += capacity
        fleet = sum(u[0] for u in used.values()) / max(sum(u[1] for u in used.values()), 1)
        if fleet < BUSY_FLEET:
            return []
        return [
            f"{url} is {flight / capacity:.0%} busy while the fleet is {fleet:.0%}: its share is far below its capacity"
            for url, (flight, capacity) in used.items()
            if capacity and flight / capacity < SHARE_FLOOR * fleet
        ]

    def _drift(self, stats: Any) -> list[str]:
        compared = sum(stats.drift.values())
        differed = compared - stats.drift.get(0, 0)
        if not differed:
            self.clean_rows = compared
            return []
        if self.clean_rows < CLEAN_ROWS:
            return []  # drift from the start: the end-of-run warning and `check` speak of that
        return [f"token-count drift appeared mid-run: {differed} rows differed after {self.clean_rows} that agreed"]

    def _cache(self) -> list[str]:
        if not self._window():
            return []
        cached0, prompt0 = self.samples[0].cached_tokens, self.samples[0].prompt_tokens
        cached1, prompt1 = self.samples[-1].cached_tokens, self.samples[-1].prompt_tokens
        before = cached0 / prompt0 if prompt0 else 0.0
        recent_prompt = prompt1 - prompt0
        if before < MIN_CACHE_SHARE or recent_prompt <= 0:
            return []
        recent = (cached1 - cached0) / recent_prompt
        if recent >= CACHE_FLOOR * before:
            return []
        return [f"prefix-cache hits collapsed: {recent:.0%} of prompt tokens lately, {before:.0%} before"]

    def _rejects(self) -> list[str]:
        """The servers (and the run) whose share of rejected answers over the last REJECT_WINDOW_S jumped."""
        last = self.samples[-1]
        mark = next((s for s in reversed(self.samples) if last.at - s.at >= REJECT_WINDOW_S), None)
        if mark is None:
            return []
        alerts = []
        for name, (answers, rejected) in last.answers.items():
            answers0, rejected0 = mark.answers.get(name, (0, 0))
            recent = answers - answers0
            if recent < REJECT_EVIDENCE:
                continue
            share, before = (rejected - rejected0) / recent, rejected0 / answers0 if answers0 else 0.0
            if share >= REJECT_HIGH or (share >= REJECT_FLOOR and share >= REJECT_JUMP * before):
                who = "the run" if name == RUN else name
                alerts.append(
                    f"{who}: {share:.0%} of its answers rejected lately ({rejected - rejected0} of {recent}), "
                    f"{before:.0%} before: a broken chat template, or a checkpoint that loops? (rejected.jsonl)"
                )
        return alerts

    def _cpu_limit(self) -> list[str]:
        """The client busy on its one core, or short of one, over the recent window: it, not the servers, sets
        the pace."""
        if not self._window():
            return []
        first, last = self.samples[0], self.samples[-1]
        ran, waited = _cpu_shares(first, last)
        over = duration(last.at - first.at)
        if ran >= CLIENT_BUSY:
            return [
                f"the client is at its CPU limit ({ran:.0%} of a core over {over}): it, not the servers, sets the "
                "pace; more --workers processes share the run"
            ]
        if _starved(ran, waited):
            return [
                f"the client is short of a CPU (over {over} it waited for one {waited:.0%} of the time and ran "
                f"{ran:.0%}): other work on this machine holds the cores it needs, and it, not the servers, sets "
                "the pace"
            ]
        return []

    def cpu_warnings(self, span_s: float) -> list[str]:
        """The end-of-run warnings when the client was at its CPU limit, or short of a CPU, for a good part of a
        run of `span_s`."""
        least = max(LIMITED_WARN_S, LIMITED_WARN_SHARE * span_s)
        out = []
        if self.limited_s >= least:
            out.append(
                f"the client was at its CPU limit (at least {CLIENT_BUSY:.0%} of a core) for "
                f"{duration(self.limited_s)} of the run's {duration(span_s)}: there it, not the servers, set the "
                "pace; more --workers processes share a run"
            )
        if self.starved_s >= least:
            out.append(
                f"the client was short of a CPU for {duration(self.starved_s)} of the run's {duration(span_s)} "
                "(other work on the machine held the cores it needed): there it, not the servers, set the pace"
            )
        return out

    def _stall(self, stats: Any, now: float) -> str | None:
        if stats.completed != self.completed:
            self.completed, self.last_completion, self.stalled = stats.completed, now, False
            return None
        quiet = now - self.last_completion
        if quiet < self.stall_s:
            return None
        alert = f"stalled: no completion for {duration(quiet)}"
        if not self.stalled:
            self.stalled = True
            log.warning("ALERT %s", alert)
            if self.on_stall:
                self.children.append(
                    self.start(self.on_stall, {"GEN_PIPELINE_ALERT": alert, "GEN_PIPELINE_OUT": self.out})
                )
        return alert


def python_cpu() -> CPU:
    """What this process's Python threads (those alive now) had of the CPUs: the CPU time of each from its own
    clock (the whole process's where threads have none), the time each waited for a CPU from Linux's
    /proc/self/task/<id>/schedstat (its second figure, in nanoseconds; none elsewhere)."""
    threads = [t for t in threading.enumerate() if t.ident]
    if not hasattr(time, "pthread_getcpuclockid"):
        ran = time.process_time()
    else:
        ran = 0.0
        for t in threads:
            with contextlib.suppress(OSError):  # it ended since enumerate(): its time is gone with it
                ran += time.clock_gettime(time.pthread_getcpuclockid(t.ident or 0))
    waited = 0
    for t in threads:
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat", "rb") as f:
                waited += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return CPU(ran, waited / 1e9)


def _cpu_shares(first: Sample, last: Sample) -> tuple[float, float]:
    """The Python threads' seconds on a CPU and waiting for one, per second, between two samples."""
    span = max(last.at - first.at, 1e-9)
    return (last.cpu.ran - first.cpu.ran) / span, (last.cpu.waited - first.cpu.waited) / span


def _starved(ran: float, waited: float) -> bool:
    """Runnable nearly all the time, but waiting for a CPU a good part of it."""
    return ran < CLIENT_BUSY <= ran + waited and waited >= CLIENT_STARVED
