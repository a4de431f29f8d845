"""Counting what a run does, showing it while it runs, and summing it up at the end."""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .changes import ChangedInputs
from .cost import cost_lines
from .identical import SameSamples
from .scatter import Scatter
from .work import Work

log = logging.getLogger("gen_pipeline")

STATUS_INTERVAL = 2.0  # seconds between status.json snapshots
# The ETA's rate is measured over this much recent history (all of it early in a run): long enough to
# smooth the ups and downs of generation lengths, short enough to follow a server going down.
ETA_WINDOW = 120.0
RATE_SAMPLE = 1.0  # seconds between the samples the window is made of
RESTARTS_NAMED = 5  # conversations answered again from turn 0 named in the summary (all are counted)
# Upper bounds (seconds) of the request-latency histogram (engine/metrics.py's gen_pipeline_request_seconds).
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)


@dataclass
class Latencies:
    """How long requests took: a count per LATENCY_BUCKETS bound (the first it fits under) and the total."""

    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    total_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total_s += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """(bound, requests that took at most that long), as a Prometheus histogram lists them."""
        return list(zip(LATENCY_BUCKETS, itertools.accumulate(self.counts), strict=True))


@dataclass
class RunStats:
    """Counters for one run; the pipeline updates them, the reporter and the summary read them."""

    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    started: float = -1.0  # clock() at creation unless given
    read: int = 0
    undispatched: int = 0  # prompts read and queued, not yet taken by a Runner worker
    completed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens, where the servers report it
    valid_output_tokens: int = 0  # completion tokens of written rows (cost.py)
    untruncated_output_tokens: int = 0  # of those, rows not cut at max_tokens
    requests: int = 0
    # answers judged by the checks (send/resample.py), and those rejected: by reason, by check, their decode tokens
    answers: int = 0
    rejects: Counter[tuple[str, str]] = field(default_factory=Counter)  # (reason, check) -> answers rejected
    rejected_tokens: int = 0
    latency: Latencies = field(default_factory=Latencies)  # every request to a server
    in_flight: int = 0
    drift: Counter[int] = field(default_factory=Counter)  # server prompt_tokens - ours -> rows
    # rows compared per request shape (tokens.conversation.SHAPES), and "<shape> drifted" for those that differed
    drift_shapes: Counter[str] = field(default_factory=Counter)
    server_cut: int = 0  # answers cut at the server's context before their max_tokens (finish_reason length)
    repeats: int = 0
    input_fraction: float = 0.0  # how much of the input file the reader has consumed
    handed_over: int = 0  # rows the reader has passed on (ahead of `read` by up to a batch), with input_fraction
    last_error: dict[str, str] = field(default_factory=dict)  # newest detail per ledger reason
    truncated_in_reasoning: int = 0  # cut at max_tokens while still thinking (no answer)
    unfinished_line: int | None = None  # the input's last line, left unread: no newline, not whole JSON yet
    input_error: str | None = None  # why the input could not be read to its end (a truncated compressed file)
    reasoning_tokens: int = 0  # usage.completion_tokens_details.reasoning_tokens, where reported
    reasoned_output_tokens: int = 0  # completion tokens of the answers that reported reasoning tokens
    # answers that thought past --thinking-budget (the servers did not enforce it), and the most thought
    over_thinking_budget: int = 0
    most_thinking: int = 0
    same_samples: SameSamples = field(default_factory=SameSamples)  # prompts whose samples all came back the same
    scatter: Scatter = field(default_factory=Scatter)  # how far apart the input has rows that begin alike
    changed: ChangedInputs = field(default_factory=ChangedInputs)  # answered rows whose prompt changed since
    # --turns all: "complete", "ended_early", and "restarted_edited" / "restarted_checkpoint" for those answered
    # again from turn 0 (their input's earlier turns changed, or another checkpoint began them: engine.reader)
    conversations: Counter[str] = field(default_factory=Counter)
    restarted_ids: list[str] = field(default_factory=list)  # the first of those, named in the summary
    # rows sent otherwise than written (inputs/shape.py): "answered_from_last_user_turn" (trailing assistant
    # turns dropped, the old answer kept as `reference`) and "user_turns_merged"
    reshaped: Counter[str] = field(default_factory=Counter)
    ended_at_turn: Counter[int] = field(default_factory=Counter)  # --turns all: the turn each ended one ended at
    work: Work = field(default_factory=Work)  # the progress unit's total, skipped and dropped units (work.py)
    outage_s: float = 0.0  # seconds with no usable server, as the monitor last saw it (0: servers are usable)
    rate_points: deque[tuple[float, int]] = field(default_factory=deque, repr=False)  # (clock, worked()) for the rate
    progressed: tuple[float, int] = (-1.0, 0)  # (clock, worked()) when rate() last saw worked() grow

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()
        self.rate_points.append((self.started, 0))
        self.progressed = (self.started, 0)

    def note_restart(self, why: str, row_id: Any) -> None:
        """A conversation is answered again from turn 0 (`why`: "edited" or "checkpoint")."""
        self.conversations[f"restarted_{why}"] += 1
        if len(self.restarted_ids) < RESTARTS_NAMED:
            self.restarted_ids.append(repr(row_id))

    def restart_warning(self) -> str | None:
        """What the summary says of the conversations answered again from turn 0, if any."""
        edited, other = self.conversations["restarted_edited"], self.conversations["restarted_checkpoint"]
        if not edited + other:
            return None
        why = [f"{edited} whose earlier user turns changed in the input"] if edited else []
        why += [f"{other} begun by a checkpoint no longer serving"] if other else []
        more = " ..." if edited + other > len(self.restarted_ids) else ""
        return (
            f"{edited + other} conversation(s) answered again from turn 0, never gone on from a history they no "
            f"longer have ({' and '.join(why)}): {', '.join(self.restarted_ids)}{more}; their new lines carry "
            "`restart` and stand in place of the old ones"
        )

    def note_input(self, rows: int, fraction: float) -> None:
        """The reader has passed on `rows` more rows, having consumed `fraction` of the input."""
        self.handed_over += rows
        self.input_fraction = fraction

    def note_shape(self, merged: int, dropped: int) -> None:
        """A row read to be sent had user turns merged (`merged`) or trailing assistant turns dropped."""
        if merged:
            self.reshaped["user_turns_merged"] += 1
        if dropped:
            self.reshaped["answered_from_last_user_turn"] += 1

    def worked(self) -> int:
        """Units settled by this run (completed, ledgered, or not sent as their conversation ended), as
        opposed to skipped as settled before (work.py: rows, samples or turns)."""
        return self.completed + sum(self.failed.values()) + self.work.dropped

    def settled(self) -> int:
        """Units settled, by this run or before it: the progress bar's count."""
        return self.worked() + self.work.skipped_units()

    def unsettled(self) -> float | None:
        """Units not settled yet: in flight, queued, read ahead, and the unread rest of the input (the input's
        count, else estimated from the share read so far, where a row's units are known); None while unknown."""
        if self.work.total is not None:
            return max(self.work.total - self.settled(), 0)
        if self.input_fraction <= 0 or self.work.unit == "turn":  # a row's turns are not known unread
            return None
        return max(self.handed_over * self.work.per_row / self.input_fraction - self.settled(), 0.0)

    def queued(self) -> int:
        """Rows read but not sent yet (the queue and the batch the reader has ready)."""
        settled = self.worked() + sum(self.skipped.values())
        return max(self.handed_over - settled - self.in_flight, 0)

    def eta(self) -> float | None:
        """Seconds left: the unsettled units at the rate this run settles them (over the last ETA_WINDOW s);
        None while unknown, and while no server is usable (the rate before an outage says nothing of it).

        Early on the rate still carries the wait for the first answers, so in a run only a few request
        latencies long the ETA starts high.
        """
        rate, left = self.eta_rate(), self.unsettled()
        return left / rate if rate and left is not None else None

    def eta_rate(self) -> float | None:
        """The rate the ETA uses: rate(), or None during an outage."""
        rate = self.rate()
        return None if self.outage_s > 0 else rate

    def rate(self) -> float:
        """Rows settled per second over the last ETA_WINDOW seconds (since the start, early on)."""
        now, worked = self.clock(), self.worked()
        if worked != self.progressed[1]:
            self.progressed = (now, worked)
        if now - self.rate_points[-1][0] >= RATE_SAMPLE:
            self.rate_points.append((now, worked))
        while len(self.rate_points) > 2 and now - self.rate_points[1][0] >= ETA_WINDOW:
            self.rate_points.popleft()  # the oldest kept is the last one at least a window old
        since, then = self.rate_points[0]
        return (worked - then) / (now - since) if now > since else 0.0

    def idle(self) -> float:
        """Seconds since a row was last settled (since the start, before the first one), as seen by rate()'s
        callers (status.json every STATUS_INTERVAL s)."""
        self.rate()
        return self.clock() - self.progressed[0]

    def elapsed(self) -> float:
        return max(self.clock() - self.started, 1e-9)

    def reasoning_view(self) -> dict[str, int] | None:
        """Reasoning and answer tokens of the answers whose usage split them (None: none did)."""
        if not self.reasoned_output_tokens and not self.reasoning_tokens:
            return None
        answer = self.reasoned_output_tokens - self.reasoning_tokens
        return {"reasoning": self.reasoning_tokens, "answer": answer, "of_output": self.reasoned_output_tokens}

    def note_drift(self, offset: int, shapes: Iterable[str]) -> None:
        """One row compared with the server's count: its offset, under each of its request shapes."""
        self.drift[offset] += 1
        for shape in shapes:
            self.drift_shapes[shape] += 1
            if offset:
                self.drift_shapes[f"{shape} drifted"] += 1

    def answers_view(self) -> dict[str, Any]:
        """The answers judged, those rejected by reason and by check, and the decode tokens they cost."""
        by_reason: Counter[str] = Counter()
        by_check: Counter[str] = Counter()
        for (reason, check), n in self.rejects.items():
            by_reason[reason] += n
            by_check[check] += n
        return {
            "attempts": self.answers,
            "rejected": dict(by_reason),
            "rejected_by_check": dict(by_check),
            "rejected_tokens": self.rejected_tokens,
        }

    def drift_view(self) -> dict[str, Any]:
        """How often the server's prompt count differed from ours, and by how much."""
        compared = sum(self.drift.values())
        differed = {str(k): v for k, v in sorted(self.drift.items()) if k != 0}
        return {"compared": compared, "differed": sum(differed.values()), "by_offset": differed}


def snapshot(stats: RunStats, servers: list[Any], state: str, now: float, alerts: Iterable[str] = ()) -> dict[str, Any]:
    """The status.json document (schema in views/status.py)."""
    t = stats.elapsed()
    eta = stats.eta()
    updated = time.time()
    return {
        "updated": updated,
        "last_settled": round(updated - stats.idle(), 1),  # a row's end; the start before the first
        "pid": os.getpid(),
        "state": state,
        "counts": {
            "unit": stats.work.unit,
            "total": stats.work.total,
            "done": stats.completed,
            "skipped": stats.work.skipped_units(),
            **({"not_sent": stats.work.dropped} if stats.work.dropped else {}),
            "failed": dict(stats.failed),
            "in_flight": stats.in_flight,
            "queued": stats.queued(),
        },
        "rates": {"req_per_s": round(stats.completed / t, 2), "out_tok_per_s": round(stats.output_tokens / t, 1)},
        "eta_s": round(eta, 1) if eta is not None else None,
        **({"outage_s": round(stats.outage_s, 1)} if stats.outage_s else {}),
        "servers": {
            s.url: {
                "in_flight": s.in_flight,
                "capacity": s.capacity,
                "healthy": now >= s.down_until,
                "requests": s.requests,
                "failures": dict(s.failures),
                # requests waiting in the server's own queue (beyond its running slots), and its prefix cache
                "queued": max(0, s.in_flight - s.capacity),
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                **({"rejected": dict(s.rejects)} if s.rejects else {}),  # its answers the checks refused
                **({"retired": True} if s.retired else {}),  # its checkpoint changed: out for good
            }
            for s in servers
        },
        "answers": stats.answers_view(),
        "last_error": dict(stats.last_error),
        "alerts": list(alerts),
    }


def _samples_lines(summary: dict[str, Any]) -> list[str]:
    """The samples and reasoning lines of the summary (none for a plain run)."""
    lines = [f"samples per prompt {summary['samples']}"] if summary.get("samples", 1) > 1 else []
    if summary.get("truncated_in_reasoning"):
        lines.append(
            f"truncated while reasoning (finish_reason length, no answer): {summary['truncated_in_reasoning']}"
        )
    if reasoning := summary.get("reasoning_tokens"):
        lines.append(f"output tokens: reasoning {reasoning['reasoning']}, answer {reasoning['answer']}")
    return lines


def reshaped_lines(reshaped: dict[str, int]) -> list[str]:
    """What the summary says of rows sent otherwise than written (inputs/shape.py)."""
    lines = []
    if n := reshaped.get("answered_from_last_user_turn"):
        lines.append(
            f"{n} row(s) ended with assistant turns: answered from their last user turn, the old answer kept "
            "on the output line as `reference`"
        )
    if n := reshaped.get("user_turns_merged"):
        lines.append(f"{n} row(s) had consecutive user turns: merged into one turn (joined by a blank line)")
    return lines


def answers_lines(summary: dict[str, Any]) -> list[str]:
    """The rejected answers as the summary and `report` print them (nothing when none was rejected)."""
    answers = summary.get("answers") or {}
    rejected = answers.get("rejected") or {}
    if not rejected:
        return []
    tokens, out = answers.get("rejected_tokens") or 0, summary.get("output_tokens") or 0
    share = f" ({100 * tokens / out:.1f}% of the output)" if out else ""
    return [
        f"answers judged {answers.get('attempts')}, rejected {sum(rejected.values())} {rejected} by check "
        f"{answers.get('rejected_by_check')}: {tokens} decode tokens{share}, kept in rejected.jsonl"
    ]


def _conversation_lines(summary: dict[str, Any]) -> list[str]:
    """--turns all: this run's conversations by how they ended (summary.json's "conversations"); the counts
    above are turns."""
    seen = summary.get("conversations")
    if not seen:
        return []
    at = ", ".join(f"turn {t}: {n}" for t, n in (seen.get("ended_at_turn") or {}).items())
    return [
        f"conversations {seen.get('complete', 0)} complete, {seen.get('ended_early', 0)} ended early"
        + (f" (at {at})" if at else "")
        + " | the counts above are turns"
    ]


def _cache_note(view: dict[str, Any]) -> str:
    """A server's prefix-cache hits, where it reports them (SGLang --enable-cache-report)."""
    cached, prompt = view.get("cached_tokens"), view.get("prompt_tokens")
    if cached is None or not prompt:
        return ""
    share = f"{100 * cached / prompt:.0f}%"
    return f", prefix cache {cached} of {prompt} prompt tokens ({share}), prefill paid {prompt - cached}"


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run summary as a few readable lines."""
    lines = [f"stopped: {summary['stop_reason']}"] if summary.get("stop_reason") else []
    lines += [
        f"completed {summary['completed']} | skipped {sum(summary['skipped'].values())} "
        f"{dict(summary['skipped']) or ''} | failed {sum(summary['failed'].values())} "
        f"{dict(summary['failed']) or ''}",
        f"tokens in {summary['input_tokens']} out {summary['output_tokens']} | "
        f"{summary['requests_per_s']} req/s, {summary['output_tokens_per_s']} out tok/s "
        f"over {summary['elapsed_s']} s",
        f"finish_reason {summary['finish_reasons']}",
    ]
    lines += _samples_lines(summary) + reshaped_lines(summary.get("reshaped") or {})
    lines += _conversation_lines(summary)
    lines += answers_lines(summary)
    lines += cost_lines(summary)
    if cursor := summary.get("input_cursor"):
        lines.append(f"input read from line {cursor['line'] + 1} (the input cursor: every row before it was settled)")
    drift = summary["token_drift"]
    lines.append(f"token count drift: {drift['differed']} of {drift['compared']} rows differed")
    if summary.get("learned_offset"):
        lines.append(f"learned count offset: {summary['learned_offset']} tokens")
    for url, view in summary["servers"].items():
        lines.append(
            f"  {url}: {view['completions']} done, failures {view['failures'] or 0}, "
            f"mean latency {_seconds(view['mean_latency_s'])}, out of service {view['out_of_service_s']} s, "
            f"capacity {view.get('capacity')} ({view.get('capacity_source')}){_cache_note(view)}"
            + (f"; RETIRED: {view['retired']}" if view.get("retired") else "")
        )
    lines.extend(f"WARNING: {w}" for w in summary["warnings"])
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    """A figure in seconds, or "-" for none (a server that answered nothing in this run)."""
    return "-" if value is None else f"{value} s"
