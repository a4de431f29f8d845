"""Bounded resampling: every answer is judged (answers/: the hygiene checks, --validate, --json-schema) and
one the checks or the loop guard reject is kept, then sent again with a new seed, at most --max-resamples
times; after that its (id, sample, turn) is ledgered `invalid` or `degenerate` with the last reason.

Each reject is handed to `keep` (the Recorder writes it to rejected.jsonl) before its resample is sent, so
a crash never loses one, and a resume counts them (Prompt.spent, read back by the resume scan): it never
resamples past the bound, and the attempt numbers go on, each with its own seed (samples.answer_seed). A
rejected answer is the model's, not the server's fault: it never counts against the server's health, only
in its reject count (ServerState.rejects), which the reject-rate alert reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..answers.checks import Answer, Verdict
from ..answers.shorten import shortened
from ..answers.validate import Validator
from ..errors import DegenerateAnswerError, InvalidAnswerError, RejectedAnswerError
from ..http import ChatResult
from ..records import Failure, Prompt, Rejected
from ..samples import place_key
from .requests import RequestPath, Track

Fields = Callable[[Prompt, int, int, int], dict[str, Any]]  # (prompt, sample, turn, attempt) -> request fields


@dataclass
class Attempts:
    """Where one answer's attempts stand: `total` rejected so far, across runs (the next attempt's number),
    `round` of them since the bound last started (a --retry-failed round starts again), and the last reject's
    reason, check and detail, and its server."""

    total: int = 0
    round: int = 0
    last: tuple[str, str, str] | None = None
    server: str | None = None  # who gave the last rejected answer (None: an earlier run's)

    @classmethod
    def of(cls, prompt: Prompt, sample: int, turn: int) -> Attempts:
        """What earlier runs spent on this answer (none: a fresh start)."""
        spent = prompt.spent.get(place_key(prompt.key, sample, turn, prompt.restart.get(sample, 0)))
        return cls() if spent is None else cls(spent.total, spent.round, (spent.reason, spent.check, spent.detail))

    def note(self, error: RejectedAnswerError) -> None:
        self.total += 1
        self.round += 1
        self.last = (error.reason, error.check, str(error))
        self.server = error.server or None


class Answered(NamedTuple):
    """An answer that passed: the result, the max_tokens that got it, its track, and the answers rejected
    before it (across runs)."""

    result: ChatResult
    budget: int
    track: Track
    rejected: int


def judged(prompt: Prompt, result: ChatResult, sample: int, turn: int | None) -> Answer:
    """What the checks see of one answer (one choice) to `prompt`."""
    return Answer(
        content=result.content,
        reasoning=result.reasoning_content,
        tool_calls=result.tool_calls,
        finish_reason=result.finish_reason,
        messages=prompt.messages,
        id=prompt.id,
        sample=sample,
        turn=turn,
        meta=prompt.meta,
    )


def refusal(
    verdict: Verdict, choice: ChatResult, tokens: int | None, server: str, answer: ChatResult
) -> InvalidAnswerError:
    """A check's verdict as the error a reject carries (its text and cost with it; the prompt's count is the
    `answer`'s: a choice of an answer with several has no usage of its own)."""
    return InvalidAnswerError(
        f"{verdict.check}: {verdict.detail}",
        check=verdict.check,
        server=server,
        content=choice.content,
        reasoning=choice.reasoning_content,
        completion_tokens=tokens,
        finish_reason=choice.finish_reason,
        prompt_tokens=None if answer.usage_problem else answer.prompt_tokens,
    )


class Resampler:
    """Gets one answer that passes the checks, or the ledger entry of one that never did."""

    def __init__(self, path: RequestPath, validator: Validator, fields: Fields) -> None:
        self.path, self.validator, self.fields = path, validator, fields
        self.bound = path.config.max_resamples
        self.keep: Callable[[Rejected], None] = lambda reject: None  # the Runner's Recorder.rejected

    def verdict(self, prompt: Prompt, choice: ChatResult, sample: int, turn: int | None) -> Verdict | None:
        """Why one answer is refused (None: it is kept); counted as an answer judged."""
        self.path.stats.answers += 1
        return self.validator.verdict(judged(prompt, choice, sample, turn))

    async def answer(
        self, prompt: Prompt, max_tokens: int, sample: int, turn: int | None, track: Track, tries: Attempts
    ) -> tuple[Answered | Failure, Track]:
        """An answer to (prompt, sample, turn) that passes, sent at most 1 + --max-resamples times in this round
        (`tries`: what was spent already); else the Failure to ledger. The last attempt's track with it."""
        t = turn or 0
        while tries.round <= self.bound:
            fields = self.fields(prompt, sample, t, tries.total)
            try:
                answer = await self.path.send(prompt, max_tokens, fields, track)
            except RejectedAnswerError as exc:  # the loop guard stopped it: no room was kept for a next turn
                self.refused(prompt, sample, turn, tries, exc, fields.get("seed"))
                track = Track(prefer=exc.server or track.server, keep=track.keep)
                continue
            if isinstance(answer, Failure):
                return answer, track
            result, budget = answer
            verdict = self.verdict(prompt, result, sample, turn)
            if verdict is None:
                return Answered(result, budget, track, tries.total), track
            error = refusal(
                verdict, result, None if result.usage_problem else result.completion_tokens, track.server, result
            )
            self.reject(prompt, sample, turn, tries, error, fields.get("seed"))
            track = Track(prefer=track.server, home=track.keep, keep=track.keep)  # its server kept the room
        return self.exhausted(prompt, tries, max_tokens, track), track

    def refused(
        self, prompt: Prompt, sample: int, turn: int | None, tries: Attempts, error: RejectedAnswerError, seed: Any
    ) -> None:
        """An answer refused on the way (the loop guard stopped it): judged, and kept as a reject."""
        self.path.stats.answers += 1
        self.reject(prompt, sample, turn, tries, error, seed)

    def reject(
        self, prompt: Prompt, sample: int, turn: int | None, tries: Attempts, error: RejectedAnswerError, seed: Any
    ) -> None:
        """Keep one rejected answer (written before anything else is sent for it) and count it; a loop's text cut
        to its head and its repeated unit (answers/shorten.py)."""
        loop = isinstance(error, DegenerateAnswerError)
        self.keep(
            Rejected(
                id=prompt.id,
                sample=sample,
                turn=turn,
                attempt=tries.total,
                reason=error.reason,
                check=error.check,
                detail=str(error)[:1000],
                completion_tokens=error.completion_tokens,
                input_tokens=prompt.input_tokens,
                prompt_tokens=error.prompt_tokens,
                finish_reason=error.finish_reason,
                server=error.server,
                seed=seed if isinstance(seed, int) else None,
                content=shortened(error.content) if loop else error.content,
                reasoning_content=shortened(error.reasoning) if loop and error.reasoning else error.reasoning,
                messages=prompt.messages,
                restart=prompt.restart.get(sample, 0),
            )
        )
        tries.note(error)
        for server in self.path.pool.servers:
            if server.url == error.server:
                server.rejects[error.reason] += 1

    def exhausted(self, prompt: Prompt, tries: Attempts, max_tokens: int, track: Track) -> Failure:
        """The ledger entry of an answer rejected every time the bound allowed."""
        reason, _, detail = tries.last or ("invalid", "", "rejected")
        return Failure(
            id=prompt.id,
            line=prompt.line,
            reason=reason,
            detail=f"{tries.round} answers rejected in a row (--max-resamples {self.bound}); the last: {detail}"[:1000],
            status=200,
            attempts=tries.round,
            input_tokens=prompt.input_tokens,
            server=tries.server or track.server or None,
            max_tokens=max_tokens,
        )
