"""The request path for one prompt, one concern per layer:

send           -> budget retries: a context 400 re-computes max_tokens from the server's numbers
_with_retries  -> transport retries (tenacity): back off, move to another server
_on_server     -> lease a server slot, send once, record the outcome on the server
client.chat    -> HTTP; then `check_answer`: a 200 that is empty or names another model is not a completion

With --loop-guard on, answers stream past the loop guard (answers/loops.py), which stops one that loops. An
SGLang server gets a `rid` with each attempt, so the client can stop an attempt it gives up on; a streamed
answer whose stream names no weights gets them from its server before its checkpoint is judged (attempts.py).

A RejectedAnswerError (the loop guard stopped the answer while it decoded) is the model's answer, not the
server's fault: the server is recorded as having answered, and the error goes up to the resampler
(resample.py), which keeps the reject and sends the row again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..answers.loops import LoopGuard
from ..config import RunConfig
from ..errors import (
    AuthError,
    BadRequestError,
    CheckpointMovedError,
    ContextOverflowError,
    EmptyCompletionError,
    EndpointError,
    FleetError,
    FleetRedeployedError,
    RejectedAnswerError,
    RequestError,
    ServerError,
    WrongModelError,
)
from ..fleet import affinity
from ..fleet.balancer import ServerPool
from ..fleet.state import ServerState
from ..http import ChatResult, Client
from ..progress.stats import RunStats
from ..records import TEMPLATE_FIELDS, Completion, Failure, Prompt
from ..tokens.budget import OffsetLearner, dispatch_budget, rebudget, room_needed
from .attempts import Rids, WeightVersions
from .retry import with_transport_retries
from .usage import usage_problem

log = logging.getLogger("gen_pipeline")


def request_body(sampling: dict[str, Any], prompt: Prompt, model: str, max_tokens: int) -> dict[str, Any]:
    """Global sampling, then the row's own sampling, then what the template renders (the row's tools and
    chat_template_kwargs, top-level as SGLang and vLLM take them), then the fixed fields."""
    body: dict[str, Any] = {**sampling, **(prompt.sampling or {})}
    if prompt.tools is not None:
        body["tools"] = prompt.tools
    if prompt.template_kwargs:
        body["chat_template_kwargs"] = prompt.template_kwargs
    body.update(model=model, messages=prompt.messages, max_tokens=max_tokens)
    return body


# Request fields that say nothing about what the model saw: the model, the prompt itself (the line's
# messages), the budget (its max_tokens) and n (how the samples were batched).
NOT_SHAPING = frozenset({"model", "messages", "max_tokens", "n"})


def shaping_fields(body: dict[str, Any]) -> dict[str, Any]:
    """What a request carried beside its messages that shapes the answer, for its output line: `tools` and
    `chat_template_kwargs` as sent, every other field (temperature, a sample's seed, ...) under `sampling`."""
    out = {k: body[k] for k in TEMPLATE_FIELDS if body.get(k) is not None}
    sampling = {k: v for k, v in body.items() if k not in NOT_SHAPING and k not in TEMPLATE_FIELDS}
    return {**out, "sampling": sampling} if sampling else out


# A row is poison only when the fleet's own failure rate makes its run of 5xx answers less likely than this.
POISON_CHANCE = 1e-3
# Reasons of answers refused by check_answer: a row's failure keeps one only when every attempt got it.
REFUSED_ANSWERS = frozenset({EmptyCompletionError.reason, WrongModelError.reason})


def check_answer(result: ChatResult, model: str, server: str) -> ChatResult:
    """The result when it is a completion of `model` (text, thinking or tool calls); else the error that
    counts against the server."""
    if result.model is not None and result.model != model:
        raise WrongModelError(f"the answer names model {result.model!r}, not {model!r}", server=server, status=200)
    if not result.content and not result.reasoning_content and not result.tool_calls:
        raise EmptyCompletionError(
            f"200 with no content and no reasoning (finish_reason {result.finish_reason!r}, "
            f"{result.completion_tokens} completion tokens)",
            server=server,
            status=200,
        )
    return result


def check_checkpoint(result: ChatResult, server: ServerState) -> None:
    """CheckpointMovedError when the answer reports another weight_version than its server did at start."""
    expected = server.identity.weight_version if server.identity is not None else None
    if result.weight_version is None or expected is None or result.weight_version == expected:
        return
    raise CheckpointMovedError(
        f"{server.url} answered from weight_version {result.weight_version!r}, not {expected!r} as at start "
        "(redeployed mid-run): taken out for the rest of the run, the row goes elsewhere",
        server=server.url,
        status=200,
    )


@dataclass
class Track:
    """What happened to one prompt so far."""

    attempts: int = 0
    exclude: frozenset[str] = frozenset()
    server: str = ""
    latency: float = 0.0
    prefer: str | None = None  # the server to use when it has a free slot (its prefix cache holds the prompt)
    home: bool = False  # `prefer` kept room for this request (a conversation's next turn: ServerPool.pick)
    keep: bool = False  # on success, the server keeps room for the conversation's next turn
    refused: int = 0  # attempts whose 200 check_answer refused
    checkpoint: str | None = None  # the fingerprint of the identity of the server that answered
    weight_version: str | None = None  # the weight_version its answer reported
    body: dict[str, Any] = dataclasses.field(default_factory=dict)  # the request last sent (its shaping fields)
    input_tokens: int = 0  # our count of the prompt, for judging the server's
    broke: set[str] = field(default_factory=set)  # servers that answered the row 5xx
    refused_by: str | None = None  # the server whose plain 400 another server was asked to judge
    other_failures: bool = False  # an attempt failed otherwise (a timeout, a refused connection, a 503...)
    rid_base: str = ""  # the start of the rid each attempt on an SGLang server carries (RequestPath.send)

    def failed(self, server: str, error: RequestError) -> None:
        """Note one failed attempt on `server`."""
        if isinstance(error, ServerError) and (error.status or 0) >= 500:
            self.broke.add(server)
        else:
            self.other_failures = True


class RequestPath:
    """Turns one budgeted prompt into a Completion or a Failure."""

    def __init__(
        self,
        config: RunConfig,
        client: Client,
        pool: ServerPool,
        model: str,
        context_length: int,
        learner: OffsetLearner,
        stats: RunStats,
        max_input: int | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.pool = pool
        self.model = model
        self.context_length = context_length
        self.max_input = max_input  # the servers refuse prompts of this many tokens or more (FleetInfo.input_limit)
        self.learner = learner
        self.stats = stats
        self.versions = WeightVersions(client, config.timeout_for(1))
        self.rids = Rids()

    def budget(self, prompt: Prompt) -> int | str:
        """The max_tokens to send `prompt` with now (our count plus the offset learned so far, its row's own
        max_tokens, this fleet's context and input cap), or why it is over length (tokens.budget.dispatch_budget)."""
        ctx, offset, cap = self.context_length, self.learner.offset, self.max_input
        return dispatch_budget(self.config, ctx, prompt.input_tokens, prompt.max_tokens, offset, prompt.at_least, cap)

    def payload(self, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
        """The request body for this prompt."""
        return request_body(self.config.sampling, prompt, self.model, max_tokens)

    async def send(
        self, prompt: Prompt, max_tokens: int, extra: dict[str, Any], track: Track
    ) -> tuple[ChatResult, int] | Failure:
        """Send the prompt with `extra` request fields (n, a sample's seed); on a context 400, shrink the
        budget to what the server says fits. What the server answered and the max_tokens that got it."""
        error: RequestError | None = None
        track.input_tokens = prompt.input_tokens
        track.rid_base = self.rids.base(prompt.key)
        budgets = self.config.retry.budget_attempts
        while budgets > 0:
            budgets -= 1
            try:
                track.body = {**self.payload(prompt, max_tokens), **extra}
                result = await self._with_retries(track.body, track)
            except ContextOverflowError as exc:
                error = exc
                self.learner.observe(prompt.input_tokens, exc.counts)
                budget = self._rebudget(exc, max_tokens, prompt)
                if budget is None:
                    break
                max_tokens = budget
                continue
            except AuthError as exc:
                raise FleetError(f"{exc.server} refused the API key: {exc}") from exc
            except EndpointError as exc:  # a wrong --servers entry, not this row's fault: no ledger entry
                raise FleetError(str(exc)) from exc
            except RejectedAnswerError:  # an answer to keep in rejected.jsonl and resample (resample.py)
                raise
            except BadRequestError as exc:
                error = exc
                if not self._second_opinion(exc, track):
                    break
                budgets += 1  # asking another server is not a budget attempt
                continue
            except RequestError as exc:
                error = exc
                break
            self._contradicted(track)
            return result, max_tokens
        assert error is not None
        failure = self._failure(prompt, error, max_tokens, track)
        if failure.reason == "server_error" and await self._breaks_servers(track):
            failure.reason = "poison"
        return failure

    def _second_opinion(self, exc: BadRequestError, track: Track) -> bool:
        """Whether to send a refused row once more, to another server: one misconfigured server (a chat
        template that fails) refuses every row, and only a second server tells its 400 from the row's."""
        if track.refused_by is not None or len(self.pool.servers) < 2:
            return False
        track.refused_by = exc.server or track.server
        return True

    def _contradicted(self, track: Track) -> None:
        """Another server served a row that `track.refused_by` refused: its 400 counts against its health."""
        for server in self.pool.servers:
            if server.url == track.refused_by:
                self.pool.record_contradicted(server)

    def _rebudget(self, exc: ContextOverflowError, sent: int, prompt: Prompt) -> int | None:
        return rebudget(
            exc.counts,
            sent_max_tokens=sent,
            context_length=self.context_length,
            margin=self.config.safety_margin,
            min_tokens=room_needed(self.config, prompt.max_tokens),
            counted=None if prompt.at_least else prompt.input_tokens + self.learner.offset,
        )

    async def _with_retries(self, payload: dict[str, Any], track: Track) -> ChatResult:
        return await with_transport_retries(self.config.retry, lambda: self._on_server(payload, track))

    async def _on_server(self, payload: dict[str, Any], track: Track) -> ChatResult:
        timeout = self.config.timeout_for(payload["max_tokens"])
        links = affinity.chain(payload.get("messages"))
        lease = self.pool.lease(track.exclude, track.prefer, payload["max_tokens"], track.home, track.keep, links)
        async with lease as server:
            track.home = False  # the room kept for it is taken or given back (ServerPool.take)
            track.attempts += 1
            track.server = server.url
            self.stats.requests += 1
            self.stats.in_flight += 1
            started = time.monotonic()
            try:
                wire = self.rids.wire(payload, track.rid_base, server)
                guard = LoopGuard(server.url) if self.config.loop_guard == "on" else None
                result = await self.client.chat(server.url, wire, timeout, guard)
                result = self._checked(await self._versioned(result, server), payload, track, server)
                result = self._judged(result, payload, track, server)
            except RejectedAnswerError as exc:  # the server answered (the model's answer was refused)
                exc.server = exc.server or server.url
                self.pool.record_success(server, time.monotonic() - started, exc.completion_tokens or 0, lease.started)
                raise
            except RequestError as exc:
                track.failed(server.url, exc)
                self.pool.record_failure(server, exc, lease.started)
                track.exclude = frozenset({server.url})
                if isinstance(exc, CheckpointMovedError):
                    self._retire(server, exc)
                raise
            finally:
                self.stats.in_flight -= 1
                track.latency = time.monotonic() - started
                self.stats.latency.add(track.latency)
            used = 0 if result.usage_problem else result.completion_tokens or 0
            self.pool.record_success(server, track.latency, used, lease.started)
            if not result.usage_problem:
                server.note_usage(result.prompt_tokens, result.cached_tokens)
                if (
                    lease.links
                    and result.cached_tokens is not None
                    and result.prompt_tokens
                    and payload.get("n", 1) == 1
                ):
                    server.prefixes.observed(lease.links, lease.expected, result.cached_tokens, result.prompt_tokens)
            return result

    async def _versioned(self, result: ChatResult, server: ServerState) -> ChatResult:
        """The result with the weight_version its server reports after it, when its stream named none and
        the server reported one at start (a whole answer names its own)."""
        expected = server.identity.weight_version if server.identity is not None else None
        if result.weight_version is not None or expected is None or not self.client.stream:
            return result
        return dataclasses.replace(result, weight_version=await self.versions.current(server.url))

    def _judged(self, result: ChatResult, payload: dict[str, Any], track: Track, server: ServerState) -> ChatResult:
        """The result, its usage flagged (and counted on its server, warned about once) when impossible."""
        n = payload.get("n", 1)
        problem = usage_problem(result, payload["max_tokens"], n, track.input_tokens, self.context_length)
        if problem is None:
            return result
        server.bad_usage += 1
        if server.bad_usage == 1:
            server.bad_usage_first = problem
            log.warning("%s reported impossible usage: %s (left out of the figures)", server.url, problem)
        return dataclasses.replace(result, usage_problem=problem)

    def _checked(self, result: ChatResult, payload: dict[str, Any], track: Track, server: ServerState) -> ChatResult:
        """check_answer and check_checkpoint, counting the attempts they refuse; what made the answer."""
        try:
            check_answer(result, payload["model"], track.server)
            check_checkpoint(result, server)
        except RequestError:
            track.refused += 1
            raise
        track.checkpoint = server.identity.fingerprint if server.identity is not None else None
        track.weight_version = result.weight_version
        return result

    def _retire(self, server: ServerState, exc: CheckpointMovedError) -> None:
        """Take a redeployed server out for good; with none left, stop the run (FleetError) before its
        rows are written as the old checkpoint's or wait for an outage."""
        self.pool.retire(server)
        if self.pool.all_retired():
            raise FleetRedeployedError(str(exc)) from exc

    def completion(self, prompt: Prompt, result: ChatResult, max_tokens: int, track: Track) -> Completion:
        """The output line of a choice the server answered for `prompt` with `max_tokens`."""
        return Completion(
            id=prompt.id,
            messages=prompt.messages,
            completion=result.content,
            finish_reason=result.finish_reason,
            input_tokens=prompt.input_tokens,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            max_tokens=max_tokens,
            server=track.server,
            attempts=track.attempts,
            latency_s=track.latency,
            model=self.model,
            meta=prompt.meta,
            key=prompt.key,
            reasoning_content=result.reasoning_content,
            checkpoint=track.checkpoint,
            weight_version=track.weight_version,
            tool_calls=result.tool_calls,
            request=shaping_fields(track.body),
            row_digest=prompt.row_digest,
        )

    async def _breaks_servers(self, track: Track) -> bool:
        """Whether the row, not the fleet, is at fault: every attempt was answered 5xx, by at least two servers
        (or the only one), the fleet's own rate of such answers to other requests does not explain that many
        in a row (`by_chance`), and each of them answers a request of our own (a sick server fails that too)."""
        if track.other_failures or len(track.broke) < min(2, len(self.pool.servers)):
            return False
        if self.by_chance(track.attempts):
            return False
        return all(await asyncio.gather(*(self._serves(url) for url in sorted(track.broke))))

    def by_chance(self, attempts: int) -> bool:
        """Whether `attempts` failures in a row are likely (over POISON_CHANCE) at the rate the fleet fails
        other requests: at 10% 5xx, two attempts both fail once in a hundred rows, which are not poison."""
        failed = sum(s.failures["server_error"] for s in self.pool.servers) - attempts
        sent = sum(s.requests for s in self.pool.servers) - attempts
        return sent > 0 and (max(0, failed) / sent) ** attempts > POISON_CHANCE

    async def _serves(self, url: str) -> bool:
        """Whether `url` completes a one-token request that no row can spoil."""
        probe = {"model": self.model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1}
        try:
            await self.client.chat(url, probe, self.config.timeout_for(1))
        except RequestError:
            return False
        return True

    def _failure(self, prompt: Prompt, error: RequestError, max_tokens: int, track: Track) -> Failure:
        reason = error.reason
        if reason in REFUSED_ANSWERS and track.refused < track.attempts:
            reason = "server_error"  # other attempts failed otherwise: not every answer was refused
        return Failure(
            id=prompt.id,
            line=prompt.line,
            reason=reason,
            detail=str(error)[:1000],
            status=error.status,
            attempts=track.attempts,
            input_tokens=prompt.input_tokens,
            server=error.server or track.server,
            max_tokens=max_tokens,
        )
