"""A run's figures: summary.json (how a run ended) and status.json (how it is doing), and one merge.

Several processes write figures for one run (the workers of `--workers K`; the claimers of a multi-node
run). Each field says once, in a rule table, how the parts add up: `SUMMARY_RULES` for summaries,
`STATUS_RULES` for live snapshots. A rule reads either every part (what a process did stays on disk
when it ends) or only the live ones (load, capacity, health, rates: a process that ended holds none).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OUTAGE, EXIT_OUTPUT
from ..progress import changes, cost
from ..progress.stats import format_summary
from ..rundir.layout import write_json_atomic

Doc = dict[str, Any]


@dataclass
class Outcome:
    """How a run ended."""

    summary: dict[str, Any]
    exit_code: int
    error: str | None = None  # why the output could not be written: one line for stderr


@dataclass(frozen=True)
class Rule:
    """How one field of several parts becomes one: `combine` over the parts' values (missing ones left out)."""

    combine: Callable[[list[Any]], Any]
    live: bool = False  # read the live parts only
    optional: bool = False  # left out of the merge when no part has it (files of an older version)


@dataclass(frozen=True)
class PerKey:
    """A mapping (servers by URL) merged key by key with its own rules."""

    rules: dict[str, Any]


def total(values: list[Any]) -> Any:
    """The sum (0 for none)."""
    return sum(v or 0 for v in values)


def tally(values: list[Any]) -> dict[str, int]:
    """Counts by name, added up."""
    return dict(sum((Counter(v or {}) for v in values), Counter()))


def largest(values: list[Any]) -> Any:
    """The largest known value (None when none is known)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def newest(values: list[Any]) -> dict[str, Any]:
    """Later parts' entries replace earlier ones (parts come oldest first)."""
    return {k: v for d in values for k, v in (d or {}).items()}


def merge(every: list[Doc], live: list[Doc], rules: dict[str, Any]) -> Doc:
    """One document from several, field by field by `rules` (a dict of Rule, PerKey or nested dicts)."""
    out: Doc = {}
    for key, rule in rules.items():
        if isinstance(rule, dict):
            out[key] = merge([d.get(key) or {} for d in every], [d.get(key) or {} for d in live], rule)
        elif isinstance(rule, PerKey):
            out[key] = _merge_per_key([d.get(key) or {} for d in every], [d.get(key) or {} for d in live], rule)
        else:
            values = [d[key] for d in (live if rule.live else every) if key in d]
            if values or not rule.optional:
                out[key] = rule.combine(values)
    return out


def _merge_per_key(every: list[Doc], live: list[Doc], per: PerKey) -> Doc:
    keys = dict.fromkeys(k for d in every for k in d)
    return {k: merge([d[k] for d in every if k in d], [d[k] for d in live if k in d], per.rules) for k in keys}


def _joined(values: list[Any]) -> str | None:
    return "; ".join(sorted({v for v in values if v})) or None


def _earliest_cursor(values: list[Any]) -> dict[str, Any] | None:
    """Each worker keeps its own input cursor: the merged one is where every worker's reading began."""
    if not values or not all(values):
        return None
    return dict(min(values, key=lambda c: c["line"]))


def _state(values: list[Any]) -> str:
    states = set(values) or {"finished"}
    return next((s for s in ("running", "stopping") if s in states), "finished")


def _eta(values: list[Any]) -> float | None:
    """The parts share no rows, so the run ends when the slowest one does; unknown if any is unknown."""
    if None in values or not values:
        return None
    return max(float(v) for v in values)


def _rounded(ndigits: int) -> Callable[[list[Any]], float]:
    return lambda values: round(total(values), ndigits)


SUM, TALLY = Rule(total), Rule(tally)


def total_if_any(values: list[Any]) -> Any:
    """The parts' sum, or None when no part reports the figure (a server that reports no prefix cache)."""
    return None if all(x is None for x in values) else total(values)


def _reasoning(values: list[Any]) -> dict[str, int] | None:
    """Reasoning and answer tokens where the servers split them (None: no part's did)."""
    split = [v for v in values if v]
    return {k: sum(v[k] for v in split) for k in split[0]} if split else None


def _ranges(values: list[Any]) -> list[int] | None:
    """The parts' capacity ranges added end by end, as their capacities are (None: no part's was watched)."""
    known = [v for v in values if v]
    return [sum(v[0] for v in known), sum(v[1] for v in known)] if known else None


# Figures a merge derives itself (merge_summaries), not from the parts' values.
DERIVED = frozenset(
    {"exit_code", "workers", "elapsed_s", "requests_per_s", "output_tokens_per_s", "token_drift.differed"}
    | {"valid_output_tokens_per_s", "untruncated_output_tokens_per_s", "gpu_hours_per_million_output_tokens"}
    | {"gpu_hours_per_million_valid_tokens", "gpu_hours_per_million_untruncated_tokens"}
)
COUNTS: tuple[str, ...] = ("read", "completed", "requests", "repeats_dropped", "input_tokens", "output_tokens")
COUNTS += ("truncated_in_reasoning", "cut_by_server")

ANSWERS_RULES: dict[str, Any] = {"attempts": SUM, "rejected": TALLY, "rejected_by_check": TALLY, "rejected_tokens": SUM}

SUMMARY_RULES: dict[str, Any] = {
    **dict.fromkeys(COUNTS, SUM),
    **dict.fromkeys(("skipped", "failed", "finish_reasons"), TALLY),
    "token_drift": {"compared": SUM, "by_offset": TALLY},
    "identical_samples": {"compared": SUM, "identical": SUM},
    "servers": PerKey(
        {
            **dict.fromkeys(("requests", "completions", "output_tokens", "prompt_tokens", "capacity"), SUM),
            "queue_margin": SUM,
            **dict.fromkeys(("cached_tokens", "prefill_tokens"), Rule(total_if_any)),
            "failures": TALLY,
            "capacity_source": Rule(_joined),
            "capacity_range": Rule(_ranges, optional=True),
            "impossible_usage": Rule(total, optional=True),
            "rejected": Rule(tally, optional=True),
            "out_of_service_s": Rule(lambda v: largest(v) or 0.0),
            # the slowest part's view: the parts share the servers, a mean of means would hide a slow one
            "mean_latency_s": Rule(largest),
            "output_tokens_per_request_s": Rule(lambda v: min((x for x in v if x is not None), default=None)),
        }
    ),
    "samples": Rule(lambda v: largest(v) or 1),
    "reasoning_tokens": Rule(_reasoning),
    "tail_s": Rule(largest),  # the run ends with its last part: the longest tail is the run's
    "stop_reason": Rule(_joined),
    "learned_offset": Rule(lambda v: largest(v) or 0),
    "input_cursor": Rule(_earliest_cursor),
    "warnings": Rule(lambda v: sorted({w for ws in v for w in ws or []})),
    # progress/cost.py: each part's share of the fleet's GPU time, and the tokens that can go into a dataset
    "gpu_hours": Rule(_rounded(4), optional=True),
    "gpus_per_server": Rule(largest, optional=True),
    "valid_output_tokens": Rule(total, optional=True),
    "untruncated_output_tokens": Rule(total, optional=True),
    "conversations": Rule(lambda v: conversations_merged(v), optional=True),  # --turns all
    "reshaped": Rule(tally, optional=True),  # rows sent otherwise than written (inputs/shape.py)
    "changed_inputs": Rule(changes.merged, optional=True),  # answered rows whose prompt changed (resume/changes.py)
    # the answer checks (send/resample.py): answers judged, rejected by reason and check, their decode tokens
    "answers": ANSWERS_RULES,
}

STATUS_RULES: dict[str, Any] = {
    "updated": Rule(lambda v: max(float(x) for x in v) if v else 0.0, live=True),
    "last_settled": Rule(largest, live=True, optional=True),
    "state": Rule(_state, live=True),
    "counts": {
        "unit": Rule(lambda v: v[0], optional=True),  # every part counts in the run's unit
        "total": Rule(lambda v: None if None in v else max(v), optional=True),  # claimers count none
        "done": SUM,
        "skipped": SUM,
        "not_sent": Rule(total, optional=True),
        "failed": TALLY,
        "in_flight": Rule(total, live=True),
        "queued": Rule(total, live=True, optional=True),
    },
    "rates": {"req_per_s": Rule(_rounded(2), live=True), "out_tok_per_s": Rule(_rounded(1), live=True)},
    "eta_s": Rule(_eta, live=True),
    "outage_s": Rule(largest, live=True, optional=True),
    "alerts": Rule(lambda v: sorted({a for alerts in v for a in alerts or []}), live=True, optional=True),
    "servers": PerKey(
        {
            "in_flight": Rule(total, live=True),
            "capacity": Rule(total, live=True),
            # one process seeing a server down is evidence enough: the others use the same server
            "healthy": Rule(lambda v: all(bool(x) for x in v), live=True),
            "requests": SUM,
            "failures": TALLY,
            "queued": Rule(total, live=True, optional=True),
            "prompt_tokens": Rule(total, optional=True),
            "cached_tokens": Rule(total_if_any, optional=True),
            "retired": Rule(lambda v: any(bool(x) for x in v), live=True, optional=True),
            "rejected": Rule(tally, optional=True),
        }
    ),
    # the answers judged and rejected so far (a part of an older version has none)
    "answers": Rule(lambda v: merge(v, v, ANSWERS_RULES), optional=True),
}


def merge_summaries(parts: list[Doc], elapsed: float, exit_code: int) -> Doc:
    """One summary.json from the parts' summaries; rates over the whole run's `elapsed` seconds."""
    merged = merge(parts, parts, SUMMARY_RULES)
    merged["token_drift"]["differed"] = sum(merged["token_drift"]["by_offset"].values())
    merged.update(
        exit_code=exit_code,
        workers=len(parts),
        elapsed_s=round(elapsed, 2),
        requests_per_s=round(merged["completed"] / max(elapsed, 1e-9), 2),
        output_tokens_per_s=round(merged["output_tokens"] / max(elapsed, 1e-9), 1),
    )
    if "gpu_hours" in merged:
        merged.update(cost.derive(merged))
    return merged


def merge_statuses(every: Iterable[Doc], live: Iterable[Doc]) -> Doc:
    """One status.json from the parts' snapshots; `live`: those of the parts still running (or all)."""
    every = list(every)
    merged = merge(every, list(live) or every, STATUS_RULES)
    by_age = sorted(every, key=lambda s: float(s.get("updated", 0)))
    merged["last_error"] = newest([s.get("last_error") for s in by_age])  # the newest text per reason
    return merged


def run_summary(stats: Any, pool: Any, exit_code: int, warnings: list[str]) -> Doc:
    """One process's summary.json from its RunStats and ServerPool (the caller adds what only it knows:
    stop_reason, input_cursor, samples, learned_offset)."""
    t = stats.elapsed()
    tail = pool.tail_seconds()
    return {
        "exit_code": exit_code,
        "stop_reason": None,
        "read": stats.read,
        "completed": stats.completed,
        "skipped": dict(stats.skipped),
        "failed": dict(stats.failed),
        "repeats_dropped": stats.repeats,
        "input_cursor": None,
        "requests": stats.requests,
        "input_tokens": stats.input_tokens,
        "output_tokens": stats.output_tokens,
        "valid_output_tokens": stats.valid_output_tokens,
        "untruncated_output_tokens": stats.untruncated_output_tokens,
        "elapsed_s": round(t, 2),
        "requests_per_s": round(stats.completed / t, 2),
        "output_tokens_per_s": round(stats.output_tokens / t, 1),
        "finish_reasons": dict(stats.finish_reasons),
        "samples": 1,
        "truncated_in_reasoning": stats.truncated_in_reasoning,
        "reasoning_tokens": stats.reasoning_view(),
        "token_drift": stats.drift_view(),
        "identical_samples": stats.same_samples.view(),
        "cut_by_server": stats.server_cut,
        "learned_offset": 0,
        "servers": pool.views(),
        "tail_s": None if tail is None else round(tail, 2),
        "warnings": warnings,
        "answers": stats.answers_view(),
        **({"reshaped": dict(stats.reshaped)} if stats.reshaped else {}),
        **({"changed_inputs": stats.changed.view()} if stats.changed.rows else {}),
        **conversations_view(stats),
    }


def conversations_merged(parts: list[Doc]) -> Doc:
    """The parts' conversations_view added up."""
    counts: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    for part in parts:
        counts.update({k: v for k, v in part.items() if k != "ended_at_turn"})
        ended.update(part.get("ended_at_turn") or {})
    return {**counts, "ended_at_turn": {t: ended[t] for t in sorted(ended, key=int)}}


def conversations_view(stats: Any) -> Doc:
    """--turns all: this run's conversations by how they ended, and the turns the early ones ended at."""
    if not stats.conversations:
        return {}
    ended = {str(t): n for t, n in sorted(stats.ended_at_turn.items())}
    return {"conversations": {**dict(stats.conversations), "ended_at_turn": ended}}


def describe(outcome: Outcome, out: Path) -> str:
    """What to print at the end of a run."""
    text = format_summary(outcome.summary)
    if outcome.exit_code in (EXIT_INTERRUPTED, EXIT_OUTAGE, EXIT_INCOMPLETE, EXIT_OUTPUT):
        text += f"\nto resume, run the same command again (output in {out})"
    return text


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Replace a status file (status.json, a claimer's) in one step, so a reader never sees half of it."""
    write_json_atomic(path, status)
