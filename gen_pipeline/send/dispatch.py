"""Sending the samples one prompt still owes, paying for its prompt once.

With `--samples-via n` (the default) one request asks for n = the missing samples; the answer's
choices are counted every time (servers have returned fewer than asked), and a short answer is
topped up with one request per missing sample, with one warning for the run. With `--samples-via
requests`, or when samples have seeds of their own (`--seed`: each sample's seed derives from (seed,
id, sample), which one request with n cannot carry), each sample is one request, and all of a
prompt's requests go to the server that answered its first, whose prefix cache holds the prompt.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import RunConfig
from ..errors import ConfigError
from ..fleet.discovery import FleetInfo
from ..http import ChatResult
from ..records import Completion, Failure, Prompt
from ..samples import sample_key, sample_seed, truncated_in, turn_seed
from .requests import RequestPath, Track
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

    def __init__(self, path: RequestPath, extra: dict[str, Any], warn: Callable[[str], None]) -> None:
        self.path = path
        self.config = path.config
        self.extra = extra  # fields every request carries (the thinking budget)
        self.warn = warn
        self.short_answers = 0

    def _seed(self, prompt: Prompt) -> int | None:
        """The seed the row's samples derive theirs from (the row's own, else the run's), if any."""
        seed = (prompt.sampling or {}).get("seed", self.config.sampling.get("seed"))
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    def _fields(self, prompt: Prompt, sample: int) -> dict[str, Any]:
        """The extra request fields of one sample sent alone."""
        seed = self._seed(prompt)
        return self.extra if seed is None else {**self.extra, "seed": sample_seed(seed, prompt.id, sample)}

    def turn_fields(self, prompt: Prompt, sample: int, turn: int) -> dict[str, Any]:
        """The extra request fields of one turn of one sample's conversation (turn 0: the sample's own)."""
        seed = self._seed(prompt)
        if seed is None or turn == 0:
            return self._fields(prompt, sample)
        return {**self.extra, "seed": turn_seed(seed, prompt.id, sample, turn)}

    async def generate(self, prompt: Prompt, max_tokens: int, samples: Sequence[int]) -> Sent:
        """Send what `samples` need; one outcome per sample, in order."""
        sent = Sent()
        if len(samples) > 1 and self.config.samples_via == "n" and self._seed(prompt) is None:
            await self._with_n(prompt, max_tokens, list(samples), sent)
        else:
            await self._one_by_one(prompt, max_tokens, list(samples), sent, prefer=None)
        return sent

    async def _with_n(self, prompt: Prompt, max_tokens: int, samples: list[int], sent: Sent) -> None:
        """One request with n = len(samples); a short answer is topped up one sample at a time."""
        track = Track()
        answer = await self.path.send(prompt, max_tokens, {**self.extra, "n": len(samples)}, track)
        if isinstance(answer, Failure):
            sent.outcomes += [dataclasses.replace(answer, sample=s) for s in samples]
            return
        result, budget = answer
        sent.count(result)
        choices = result.choices or (result,)
        got = min(len(choices), len(samples))
        for choice, s in zip(choices[:got], samples, strict=False):
            sent.outcomes.append(self.completion(prompt, choice, budget, track, s, result))
        if got < len(samples):
            self._short(track.server, len(samples), len(choices))
            await self._one_by_one(prompt, max_tokens, samples[got:], sent, prefer=track.server)

    def _short(self, server: str, asked: int, got: int) -> None:
        """Warn once per run that a server answered a request with n with fewer choices."""
        self.short_answers += 1
        if self.short_answers == 1:
            self.warn(
                f"{server} answered n={asked} with {got} choice(s): the missing samples are sent one "
                "request each (counted every time; this warning is shown once)"
            )

    async def _one_by_one(
        self, prompt: Prompt, max_tokens: int, samples: list[int], sent: Sent, prefer: str | None
    ) -> None:
        """One request per sample, each on the server that answered the prompt before when it has room."""
        for s in samples:
            track = Track(prefer=prefer)
            answer = await self.path.send(prompt, max_tokens, self._fields(prompt, s), track)
            if isinstance(answer, Failure):
                sent.outcomes.append(dataclasses.replace(answer, sample=s))
                continue
            result, budget = answer
            sent.count(result)
            sent.outcomes.append(self.completion(prompt, result, budget, track, s, result))
            prefer = track.server

    def completion(
        self, prompt: Prompt, choice: ChatResult, budget: int, track: Track, sample: int, answer: ChatResult
    ) -> Completion:
        """One sample's output line from one choice of `answer`. A choice of an answer with several has
        no usage of its own: its completion_tokens is left null (the summary counts the answer's)."""
        done = self.path.completion(prompt, choice, budget, track)
        done.sample, done.key = sample, sample_key(prompt.key, sample)
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
