"""Sending the samples one prompt still owes, paying for its prompt once.

With `--samples-via n` (the default) one request asks for n = the missing samples; the answer's
choices are counted every time (servers have returned fewer than asked), and a short answer is
topped up with one request per missing sample, with one warning for the run. With `--samples-via
requests`, or when samples have seeds of their own (`--seed`: each sample's seed derives from (seed,
id, sample), which one request with n cannot carry), each sample is one request, and all of a
prompt's requests go to the server that answered its first, whose prefix cache holds the prompt.

Every answer is judged (resample.py): a choice of a request with n that is refused is kept and its sample
resampled one request at a time; a sample sent alone is resampled by the Resampler until it passes or the
bound is reached.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..answers.validate import Validator
from ..config import RunConfig
from ..errors import ConfigError, RejectedAnswerError
from ..fleet.discovery import FleetInfo
from ..http import ChatResult
from ..records import Completion, Failure, Prompt
from ..samples import answer_seed, place_key, truncated_in
from .requests import RequestPath, Track
from .resample import Attempts, Resampler, refusal
from .usage import server_usage

log = logging.getLogger("gen_pipeline")

# The thinking-budget request field of each server kind (the model card's owned_by).
THINKING_BUDGET_FIELDS = {"sglang": "thinking_budget", "vllm": "thinking_token_budget"}


def thinking_fields(config: RunConfig, fleet: FleetInfo) -> dict[str, Any]:
    """The request field --thinking-budget sends on this fleet; ConfigError where a server has none."""
    if config.thinking_budget is None:
        return {}
    names = {s.url: THINKING_BUDGET_FIELDS.get(s.kind or "") for s in fleet.servers}
    lacking = [f"{s.url} ({s.kind or 'kind not reported'})" for s in fleet.servers if not names[s.url]]
    if lacking:
        known = ", ".join(f"{k}: {v}" for k, v in THINKING_BUDGET_FIELDS.items())
        raise ConfigError(f"--thinking-budget: no thinking-budget parameter known for {', '.join(lacking)} ({known})")
    if len(set(names.values())) > 1:
        raise ConfigError(f"--thinking-budget: the servers take different parameters {names}; run them apart")
    return {next(iter(names.values())): config.thinking_budget}  # type: ignore[dict-item]


@dataclass
class Sent:
    """What one prompt's dispatch produced: one outcome per sample, and the tokens the servers reported."""

    outcomes: list[Completion | Failure] = field(default_factory=list)
    output_tokens: int = 0
    reasoning_tokens: int | None = None  # None: no answer reported them
    cached_tokens: int = 0  # prompt tokens the servers' prefix caches served, where they report them

    def count(self, result: ChatResult) -> None:
        """Add one answer's usage (a request with n reports its samples together); an impossible one adds nothing."""
        if result.usage_problem is not None:
            return
        self.output_tokens += result.completion_tokens or 0
        self.cached_tokens += result.cached_tokens or 0
        if result.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + result.reasoning_tokens


class SampleDispatch:
    """Turns one budgeted prompt and the samples it owes into one Completion or Failure per sample."""

    def __init__(
        self, path: RequestPath, extra: dict[str, Any], warn: Callable[[str], None], validator: Validator | None = None
    ) -> None:
        self.path = path
        self.config = path.config
        self.extra = extra  # fields every request carries (the thinking budget)
        self.warn = warn
        self.short_answers = 0
        validator = validator or Validator.build(self.config.validate, self.config.json_schema)
        self.answers = Resampler(path, validator, self.attempt_fields)

    def _seed(self, prompt: Prompt) -> int | None:
        """The seed the row's samples derive theirs from (the row's own, else the run's), if any."""
        seed = (prompt.sampling or {}).get("seed", self.config.sampling.get("seed"))
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    def attempt_fields(self, prompt: Prompt, sample: int, turn: int, attempt: int) -> dict[str, Any]:
        """The extra request fields of one attempt at one answer sent alone: with a seed, its own
        (samples.answer_seed: the sample's, or turn's, for attempt 0; a new draw for each resample)."""
        seed = self._seed(prompt)
        if seed is None:
            return self.extra
        return {**self.extra, "seed": answer_seed(seed, prompt.id, sample, turn, attempt)}

    async def generate(self, prompt: Prompt, max_tokens: int, samples: Sequence[int]) -> Sent:
        """Send what `samples` need; one outcome per sample."""
        sent = Sent()
        tries = {s: Attempts.of(prompt, s, 0) for s in samples}
        if len(samples) > 1 and self.config.samples_via == "n" and self._seed(prompt) is None:
            await self._with_n(prompt, max_tokens, tries, sent)
        else:
            await self._one_by_one(prompt, max_tokens, tries, sent, prefer=None)
        return sent

    async def _with_n(self, prompt: Prompt, max_tokens: int, tries: dict[int, Attempts], sent: Sent) -> None:
        """One request with n = the samples the bound still allows; a short answer, and the samples whose
        choice was rejected, go on one request per sample."""
        samples = [s for s, t in tries.items() if t.round <= self.answers.bound]
        if len(samples) < 2:  # the others were rejected as often as the bound allows: ledgered one by one
            await self._one_by_one(prompt, max_tokens, tries, sent, prefer=None)
            return
        track = Track()
        try:
            answer = await self.path.send(prompt, max_tokens, {**self.extra, "n": len(samples)}, track)
        except RejectedAnswerError as exc:  # the loop guard stopped the request: one choice's text is kept
            self.answers.refused(prompt, samples[0], None, tries[samples[0]], exc, None)
            await self._one_by_one(prompt, max_tokens, tries, sent, prefer=exc.server or None)
            return
        if isinstance(answer, Failure):
            sent.outcomes += [dataclasses.replace(answer, sample=s) for s in samples]
            return
        result, budget = answer
        sent.count(result)
        choices = result.choices or (result,)
        got = min(len(choices), len(samples))
        share = None if result.usage_problem else (result.completion_tokens or 0) // len(choices)
        for choice, s in zip(choices[:got], samples, strict=False):
            verdict = self.answers.verdict(prompt, choice, s, None)
            if verdict is None:
                sent.outcomes.append(self.completion(prompt, choice, budget, track, s, result))
                del tries[s]
                continue
            sent.output_tokens -= share or 0  # counted with the reject instead (Recorder.rejected)
            self.answers.reject(prompt, s, None, tries[s], refusal(verdict, choice, share, track.server, result), None)
        if got < len(samples):
            self._short(track.server, len(samples), len(choices))
        await self._one_by_one(prompt, max_tokens, tries, sent, prefer=track.server)

    def _short(self, server: str, asked: int, got: int) -> None:
        """Warn once per run that a server answered a request with n with fewer choices."""
        self.short_answers += 1
        if self.short_answers == 1:
            self.warn(
                f"{server} answered n={asked} with {got} choice(s): the missing samples are sent one "
                "request each (counted every time; this warning is shown once)"
            )

    async def _one_by_one(
        self, prompt: Prompt, max_tokens: int, tries: dict[int, Attempts], sent: Sent, prefer: str | None
    ) -> None:
        """One request per sample (resampled while rejected), each on the server that answered the prompt
        before when it has room."""
        for s, spent in tries.items():
            answer, track = await self.answers.answer(prompt, max_tokens, s, None, Track(prefer=prefer), spent)
            if isinstance(answer, Failure):
                sent.outcomes.append(dataclasses.replace(answer, sample=s))
                continue
            sent.count(answer.result)
            done = self.completion(prompt, answer.result, answer.budget, track, s, answer.result)
            if answer.rejected:
                done.extra["rejected"] = answer.rejected
            sent.outcomes.append(done)
            prefer = track.server

    def completion(
        self, prompt: Prompt, choice: ChatResult, budget: int, track: Track, sample: int, answer: ChatResult
    ) -> Completion:
        """One sample's output line from one choice of `answer`. A choice of an answer with several has
        no usage of its own: its completion_tokens is left null (the summary counts the answer's)."""
        done = self.path.completion(prompt, choice, budget, track)
        # a row answered again (--redo-changed) writes its sample's next restart generation (samples.py)
        done.sample, done.restart = sample, prompt.restart.get(sample, 0)
        done.key = place_key(prompt.key, sample, 0, done.restart)
        done.prompt_tokens = answer.prompt_tokens
        single = not answer.choices
        if not single:
            done.completion_tokens = None
        cut = truncated_in(choice.finish_reason, choice.content, choice.reasoning_content)
        extra: dict[str, Any] = {"truncated_in": cut} if cut else {}
        if single and answer.reasoning_tokens is not None:
            extra["reasoning_tokens"] = answer.reasoning_tokens
        if choice.logprobs is not None:
            extra["logprobs"] = choice.logprobs
        if answer.usage_problem is not None:  # null counts: every reader leaves them out of its figures
            done.prompt_tokens = done.completion_tokens = None
            extra.pop("reasoning_tokens", None)
            extra.update(usage_invalid=answer.usage_problem, server_usage=server_usage(answer))
        done.extra = extra
        return done
