"""Where a settled row goes: one line in the output or the ledger, and the run's figures with it.

The Runner decides what to send; the Recorder writes what came of it. A write that fails (disk full, I/O
error) stops the run through `stop` and is kept in `fatal`: what is on disk stays valid, nothing after it is
written. The first rows compared with the servers' counts are judged here too, since it is their figures
that show a tokenizer the servers do not use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from ..config import RunConfig
from ..errors import EXIT_ERROR, EXIT_OUTPUT, OutputError
from ..inputs.rows import BadRow
from ..inputs.source import Skipped
from ..progress.cost import useful_tokens
from ..progress.identical import greedy
from ..progress.stats import RunStats
from ..records import TRANSIENT_REASONS, Completion, Failure, Prompt, Rejected
from ..runtime import say
from ..send.dispatch import Sent
from ..tokens.conversation import shapes
from ..tokens.findings import DRIFT_EVIDENCE, early_drift_problem
from .reader import conversation

log = logging.getLogger("gen_pipeline")

# Poison rows named one by one in the summary's warnings (the ledger holds them all).
POISON_NAMED = 10


# Reasoning tokens past --thinking-budget that a server enforcing it may still report (its closing marker).
THINKING_SLACK = 2


class Lines(Protocol):
    """What the Recorder writes to (the Runner's sink)."""

    def write_completion(self, completion: Completion) -> None:
        """Append one completion line."""

    def write_failure(self, failure: Failure) -> None:
        """Append one ledger entry."""

    def write_rejected(self, rejected: Rejected) -> None:
        """Append one rejected answer."""


class Recorder:
    """Writes each outcome once and counts it; `stop(reason, exit_code)` ends the run on a failed write."""

    def __init__(
        self,
        config: RunConfig,
        writer: Lines,
        stats: RunStats,
        tokenizer: str,
        stop: Callable[[str, int], None],
        warnings: list[str],
    ) -> None:
        self.config, self.writer, self.stats, self.tokenizer = config, writer, stats, tokenizer
        self.stop, self.warnings = stop, warnings
        self.fatal: OutputError | None = None
        self.drift_judged = False  # the first rows' token drift was judged (early_drift_problem)

    def unsent(self, item: BadRow | Skipped) -> None:
        """Rows that need no request: skipped (settled earlier; `count` of them) or bad input."""
        if isinstance(item, Skipped):
            self.stats.read += item.count
            self.stats.skipped[item.reason] += item.count
        else:
            self.stats.read += 1
            self.failure(Failure(item.id, item.line, "bad_input", item.detail, shard_id=item.shard_id))

    def sent(self, prompt: Prompt, sent: Sent) -> bool:
        """Write what one prompt's requests came to; True when a sample failed for a transient reason."""
        transient = False
        kinds = shapes(conversation(prompt))
        for outcome in sent.outcomes:
            if prompt.dropped and isinstance(outcome, Completion):  # the row's own old answer (inputs/shape.py)
                outcome.extra["reference"] = prompt.reference
            if isinstance(outcome, Failure) and outcome.turn is None:  # a row answered again (--redo-changed)
                outcome.restart = prompt.restart.get(outcome.sample, outcome.restart)
            if isinstance(outcome, Failure):
                self.failure(outcome)
                transient = transient or outcome.reason in TRANSIENT_REASONS
            elif self._written(outcome):
                self._count(outcome, kinds)
            else:
                transient = True
        self.stats.output_tokens += sent.output_tokens
        self.stats.cached_tokens += sent.cached_tokens
        valid, untruncated = useful_tokens(sent.outcomes, sent.output_tokens)
        self.stats.valid_output_tokens += valid
        self.stats.untruncated_output_tokens += untruncated
        if sent.reasoning_tokens is not None:
            self.stats.reasoning_tokens += sent.reasoning_tokens
            self.stats.reasoned_output_tokens += sent.output_tokens
        done = [o for o in sent.outcomes if isinstance(o, Completion)]
        if done:
            self.stats.input_tokens += prompt.input_tokens  # once: one request with n, or a cached prefix
            self.judge_samples(prompt, done)
        return transient

    def judge_samples(self, prompt: Prompt, done: list[Completion]) -> None:
        """Count prompts whose samples all came back the same (not asked greedy); warn once when many did."""
        if greedy({**self.config.sampling, **(prompt.sampling or {})}):
            return
        if self.stats.same_samples.note(done):
            log.warning("%s", self.stats.same_samples.warning())

    def rejected(self, reject: Rejected) -> None:
        """One rejected answer kept (rejected.jsonl) and counted: its decode tokens are output the run paid for
        but can never use (progress/cost.py)."""
        self._write(self.writer.write_rejected, reject)
        self.stats.rejects[reject.reason, reject.check] += 1
        self.stats.rejected_tokens += reject.completion_tokens or 0
        self.stats.output_tokens += reject.completion_tokens or 0

    def failure(self, failure: Failure) -> None:
        """One ledger line, and the reason's count and newest detail."""
        failure.source = self.config.input.name
        self._write(self.writer.write_failure, failure)
        self.stats.failed[failure.reason] += 1
        if failure.turn is not None and failure.reason not in TRANSIENT_REASONS:
            self.stats.conversations["ended_early"] += 1  # --turns all: a permanent failure ends it at its turn
            self.stats.ended_at_turn[failure.turn] += 1
        self.stats.last_error[failure.reason] = f"{failure.server or failure.source}: {failure.detail}"[:300]
        if failure.reason == "poison" and self.stats.failed["poison"] <= POISON_NAMED:
            self.warnings.append(
                f"row {failure.id!r} (line {failure.line}) was answered 5xx by every server it was sent to, "
                f"and they serve other requests: ledgered `poison` (a rerun skips it, --retry-failed poison "
                f"sends it again). The server said: {failure.detail[:200]}"
            )

    def _count(self, outcome: Completion, kinds: frozenset[str] = frozenset()) -> None:
        """Add one written completion to the run's figures (`kinds`: its request's shapes)."""
        self.stats.completed += 1
        self.stats.finish_reasons[str(outcome.finish_reason)] += 1
        if outcome.extra.get("truncated_in") == "reasoning":
            self.stats.truncated_in_reasoning += 1
        thought, budget = outcome.extra.get("reasoning_tokens"), self.config.thinking_budget
        if budget is not None and isinstance(thought, int) and thought > budget + THINKING_SLACK:
            self.stats.over_thinking_budget += 1
            self.stats.most_thinking = max(self.stats.most_thinking, thought)
        self.stats.server_cut += cut_by_server(outcome)
        if outcome.prompt_tokens is not None:
            self.stats.note_drift(outcome.prompt_tokens - outcome.input_tokens, kinds)
            if not self.drift_judged:
                self._judge_drift()

    def _judge_drift(self) -> None:
        """Stop, unless --force, when every one of the first rows compared drifted unlearnably."""
        if sum(self.stats.drift.values()) < DRIFT_EVIDENCE:
            return
        self.drift_judged = True
        problem = early_drift_problem(self.stats.drift, self.tokenizer, self.stats.drift_shapes)
        if problem is None:
            return
        if self.config.force:
            self.warnings.append(f"PROBLEM ignored (--force): {problem}")
            return
        say(f"PROBLEM: {problem}")
        self.stop(f"PROBLEM: {problem}", EXIT_ERROR)

    def _written(self, done: Completion) -> bool:
        """Write one completion; a completion that cannot be made a line (the client refuses such answers
        as malformed, so this is the last guard) is ledgered in its place, and the run goes on."""
        try:
            self._write(self.writer.write_completion, done)
            return True
        except orjson.JSONEncodeError as exc:
            detail = f"the answer cannot be written as a line: {exc}"
            self.failure(
                Failure(
                    done.id,
                    None,
                    "server_error",
                    detail,
                    server=done.server,
                    sample=done.sample,
                    turn=done.turn,
                    attempts=done.attempts,
                    max_tokens=done.max_tokens,
                )
            )
            return False

    def _write(self, write: Any, record: Any) -> None:
        try:
            write(record)
        except OutputError as exc:
            self.fatal = exc
            self.stop(str(exc), EXIT_OUTPUT)
            raise


def cut_by_server(done: Completion) -> bool:
    """Whether the server cut this answer before the max_tokens we sent (finish_reason length with fewer
    completion tokens): vLLM >= 0.33 and llama.cpp answer an input + max_tokens over their context that
    way instead of refusing it. Our budget keeps within the context, so this means the server's context or
    count is not ours. A choice of an answer with several (no usage of its own) is not judged."""
    used = done.completion_tokens
    return done.finish_reason == "length" and used is not None and used < done.max_tokens
