"""check's budget plan: every row read, validated and counted as generate does, and budgeted with generate's
own arithmetic (tokens.budget), nothing sent; and what in it is a problem."""

from __future__ import annotations

import logging
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..config import RunConfig
from ..engine.reader import BatchReader, unfinished_warning
from ..inputs.rows import BadRow
from ..inputs.source import Skipped
from ..progress.changes import changed_warning
from ..progress.scatter import Scatter
from ..progress.stats import RunStats, reshaped_lines
from ..records import Prompt
from ..resume.settled import ResumeState
from ..tokens import TokenCounter
from ..tokens.budget import prompt_budget
from ..views.rundata import distribution

log = logging.getLogger("gen_pipeline")

WASTE_SHARE = 0.5  # more than this share of prompts over_length or starved is a problem


STARVED_FRACTION = 0.25  # a clamp below this fraction of the requested budget starves the row


PLAN_LOG_INTERVAL = 10.0


EXAMPLES = 3


@dataclass
class Plan:
    """The budget plan over the whole input, with generate's own arithmetic."""

    rows: int = 0
    bad: int = 0
    repeats: int = 0
    settled: Counter[str] = field(default_factory=Counter)
    full: int = 0
    clamped: int = 0
    starved: int = 0
    over_length: int = 0
    own_budget: int = 0
    samples: int = 0  # completions to make: each prompt's samples still owed (--samples, a row's own)
    input_tokens: int = 0
    output_budget: int = 0
    lengths: array[int] = field(default_factory=lambda: array("q"))
    clamped_to: array[int] = field(default_factory=lambda: array("q"))
    bad_examples: list[str] = field(default_factory=list)
    scatter: Scatter = field(default_factory=Scatter)  # the reader's: rows that begin alike, how far apart
    later_turns: int | None = None  # --turns all: the turns after the first, of the conversations owed
    unfinished: str | None = None  # a last line left unread (no newline, not whole JSON yet): what generate says
    read_error: str | None = None  # why the input cannot be read to its end (a cut gzip or zstd stream)
    reshaped: dict[str, int] = field(default_factory=dict)  # rows sent otherwise than written (inputs/shape.py)
    changed: dict[str, Any] = field(default_factory=dict)  # answered rows whose prompt changed (resume/changes.py)

    @property
    def prompts(self) -> int:
        return self.full + self.clamped + self.over_length

    def add(self, p: Prompt, requested: int, budget: int | None) -> None:
        """Count one valid row and the budget generate would give it."""
        self.lengths.append(p.input_tokens)
        if p.turns is not None:  # only the next turn is planned: the others depend on the answers
            # per conversation owed, the turns after the one it goes on at (turn 0, or where a run left it)
            starts = [p.resume[s][0] if s in p.resume else 0 for s in p.pending or (0,)]
            self.later_turns = (self.later_turns or 0) + sum(len(p.turns) - 1 - t for t in starts)
        self.own_budget += p.max_tokens is not None
        if budget is None:
            self.over_length += 1
            return
        k = len(p.pending) or 1
        self.samples += k
        self.input_tokens += p.input_tokens  # once: one request with n, or the server's prefix cache
        self.output_budget += budget * k
        if budget >= requested:
            self.full += 1
            return
        self.clamped += 1
        self.clamped_to.append(budget)
        self.starved += budget < STARVED_FRACTION * requested

    def view(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "prompts": self.prompts,
            "full": self.full,
            "clamped": self.clamped,
            "clamped_to": distribution(self.clamped_to),
            "starved": self.starved,
            "over_length": self.over_length,
            "bad_input": self.bad,
            "bad_examples": self.bad_examples,
            "repeats_dropped": self.repeats,
            "already_settled": dict(self.settled),
            "rows_with_own_max_tokens": self.own_budget,
            "samples": self.samples,
            "input_length": distribution(self.lengths),
            "input_tokens": self.input_tokens,
            "output_budget": self.output_budget,
            "expected_total_tokens": self.input_tokens + self.output_budget,
            **({"later_turns": self.later_turns} if self.later_turns is not None else {}),
            **({"reshaped": self.reshaped} if self.reshaped else {}),
            **({"changed_inputs": self.changed} if self.changed else {}),
        }


def budget_plan(
    config: RunConfig, counter: TokenCounter, ctx: int, resume: ResumeState, max_input: int | None = None
) -> Plan:
    """Read and count every row as generate does (BatchReader), and budget it as generate does (`max_input`:
    the fleet's input cap)."""
    plan, stats = Plan(), RunStats()
    resume.samples, resume.turns = config.samples, config.turns == "all"
    reader = BatchReader(config, counter, resume, stats, context_length=ctx)
    last_log = time.monotonic()
    while batch := reader.next_batch()[0]:
        for item in batch:
            _plan_item(plan, item, config, ctx, max_input)
        if time.monotonic() - last_log > PLAN_LOG_INTERVAL:
            last_log = time.monotonic()
            log.info("check: counted %d rows", plan.rows)
    plan.repeats, plan.scatter = stats.repeats, stats.scatter
    plan.read_error, plan.reshaped, plan.changed = stats.input_error, dict(stats.reshaped), stats.changed.view()
    if stats.unfinished_line is not None:
        plan.unfinished = unfinished_warning(config, stats.unfinished_line)
    return plan


def _plan_item(plan: Plan, item: Prompt | BadRow | Skipped, config: RunConfig, ctx: int, max_input: int | None) -> None:
    if isinstance(item, Skipped):
        plan.rows += item.count
        plan.settled[item.reason] += item.count
        return
    plan.rows += 1
    if isinstance(item, BadRow):
        plan.bad += 1
        if len(plan.bad_examples) < EXAMPLES:
            plan.bad_examples.append(f"line {item.line}: {item.detail}")
    else:
        requested = item.max_tokens or config.max_tokens
        plan.add(item, requested, prompt_budget(config, ctx, item.input_tokens, item.max_tokens, max_input))


def plan_findings(plan: Plan, found: Any, cache_tokens: int) -> None:
    """Nothing to send, everything over-length, or most of the budget wasted are problems; rows that begin
    alike read further apart than the fleet's prefix caches (`cache_tokens`) reach, a warning."""
    n = plan.prompts
    if n == 0 and not plan.settled:
        found.problems.append(f"no valid prompt in the input ({plan.bad} bad row(s))")
    elif n == 0:
        found.warnings.append(f"nothing left to send: --out already settled every row {dict(plan.settled)}")
    elif n and plan.over_length == n:
        found.problems.append(f"every prompt ({n}) is over_length: nothing would be sent")
    elif n and plan.over_length + plan.starved > WASTE_SHARE * n:
        share = (plan.over_length + plan.starved) / n
        found.problems.append(
            f"{share:.0%} of prompts are over_length ({plan.over_length}) or clamped below a quarter of "
            f"their budget ({plan.starved}): use a longer context, a lower --max-tokens or shorter prompts"
        )
    if plan.bad:
        found.warnings.append(f"{plan.bad} bad row(s) go to the ledger as bad_input, e.g. {plan.bad_examples[0]}")
    if plan.over_length and plan.over_length < n:
        found.warnings.append(f"{plan.over_length} prompt(s) go to the ledger as over_length (not sent)")
    if (scattered := plan.scatter.warning(cache_tokens)) is not None:
        found.warnings.append(scattered)
    if (changed := changed_warning(plan.changed)) is not None:
        found.warnings.append(changed)
    if plan.unfinished is not None:  # generate says the same, and exits 3 (incomplete)
        found.warnings.append(f"{plan.unfinished}: generate exits 3 (incomplete) until it does")
    if plan.read_error is not None:
        found.problems.append(f"{plan.read_error}: generate settles every row before it, then stops (exit 1)")


def plan_lines(report: dict[str, Any]) -> list[str]:
    """The plan part of check's report as readable lines."""
    plan, b, s = report.get("plan"), report["budget"], report.get("settings", {})
    if plan is None:
        return ["plan: not made"]
    sent = plan["full"] + plan["clamped"]
    clamped = plan["clamped_to"]
    lines = [
        f"plan: context {s['context_length']}, --max-tokens {b['max_tokens']}, --min-tokens {b['min_tokens']}, "
        f"--safety-margin {b['safety_margin']} ({plan['rows_with_own_max_tokens']} rows set their own max_tokens)",
        f"  {plan['rows']} rows: {sent} sent ({plan['full']} with the full budget, {plan['clamped']} clamped), "
        f"{plan['over_length']} over_length, {plan['bad_input']} bad_input, {plan['repeats_dropped']} repeats dropped",
        f"  input tokens  {dist(plan['input_length'])}",
    ]
    if plan["clamped"]:
        lines.append(f"  clamped to    {dist(clamped)}; {plan['starved']} below a quarter of their budget")
    if plan["already_settled"]:
        lines.append(f"  already settled in --out (skipped): {plan['already_settled']}")
    lines.append(f"  samples to make: {plan['samples']:,}")
    lines += [f"  {line}" for line in reshaped_lines(plan.get("reshaped") or {})]
    if "later_turns" in plan:
        lines.append(
            f"  --turns all: the first turn of each conversation is planned; {plan['later_turns']:,} later turn(s) "
            "depend on the answers (each is counted and budgeted when its history is known)"
        )
    lines.append(
        f"  tokens: input {plan['input_tokens']:,} + output at most {plan['output_budget']:,} "
        f"= {plan['expected_total_tokens']:,}"
    )
    return lines


def dist(d: dict[str, Any]) -> str:
    """A distribution as `key value` pairs (none when empty)."""
    return "  ".join(f"{k} {v}" for k, v in d.items()) if d["n"] else "none"
