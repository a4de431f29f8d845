"""Retry decisions as small pure functions, and the tenacity strategies built from them.

Two kinds of retry are kept apart. Transport trouble (refused, reset, timeout, 5xx, 429, 503) backs
off and moves to another server with the same request. A context-length 400 changes the request:
its budget is recomputed from the server's own numbers, and that uses up one budget attempt.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from .config import MAX_LEARNED_OFFSET, OFFSET_EVIDENCE, RetryPolicy
from .errors import OverflowCounts, OverloadedError, RetryableError

T = TypeVar("T")

# SGLang's scheduler refuses inputs of context - 6 tokens or more (server-api.md §1.2 C).
SGLANG_INPUT_HEADROOM = 7


def backoff_delay(policy: RetryPolicy, attempt: int, retry_after: float | None = None) -> float:
    """Seconds to wait before transport attempt `attempt + 1` (attempt counts from 1)."""
    if retry_after is not None:
        return min(retry_after, policy.max_retry_after)
    base = min(policy.initial_delay * 2 ** (attempt - 1), policy.max_delay)
    return float(base * (0.5 + policy.jitter.random() / 2))  # jitter in [base/2, base]


def rebudget(
    counts: OverflowCounts,
    *,
    sent_max_tokens: int,
    context_length: int,
    margin: int,
    min_tokens: int,
) -> int | None:
    """A smaller max_tokens that the server's own numbers say will fit, or None when none will.

    None means the prompt itself is too long for the server (or the error gave no usable counts),
    so resending cannot help.
    """
    if counts.input_tokens is None or counts.lower_bound or counts.max_input is not None:
        return None
    ctx = min(context_length, counts.context_length or context_length)
    if counts.input_tokens > ctx - SGLANG_INPUT_HEADROOM:
        return None
    # -1: SGLang <= 0.5.9 refuses input + max_tokens == context; the margin covers the rest.
    room = ctx - counts.input_tokens - max(margin, 1)
    budget = min(room, sent_max_tokens - 1)
    return budget if budget >= min_tokens else None


class OffsetLearner:
    """Learns a constant gap between the server's input count and ours.

    SGLang with speculative decoding adds its reserved draft tokens to the count in its 400 messages,
    so every near-limit row would 400 once. When the same positive gap is seen OFFSET_EVIDENCE times,
    budgets include it from then on.
    """

    def __init__(self) -> None:
        self.seen: Counter[int] = Counter()
        self.offset = 0

    def observe(self, ours: int, counts: OverflowCounts) -> None:
        """Note one overflow where both counts are known exactly."""
        if counts.input_tokens is None or counts.lower_bound:
            return
        gap = counts.input_tokens - ours
        if 0 < gap <= MAX_LEARNED_OFFSET:
            self.seen[gap] += 1
            if self.seen[gap] >= OFFSET_EVIDENCE and gap > self.offset:
                self.offset = gap


Sleep = Callable[[float], Awaitable[None]]


def _retry_after(error: BaseException | None) -> float | None:
    return error.retry_after if isinstance(error, OverloadedError) else None


def _wait(policy: RetryPolicy, done: int) -> Any:
    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return backoff_delay(policy, state.attempt_number + done, _retry_after(error))

    return wait


def transport_retrying(policy: RetryPolicy, done: int = 0, sleep: Sleep = asyncio.sleep) -> AsyncRetrying:
    """Retry transport errors with exponential backoff and jitter, up to policy.max_attempts in all
    (`done` attempts already made)."""
    return AsyncRetrying(
        sleep=sleep,
        stop=stop_after_attempt(policy.max_attempts - done),
        wait=_wait(policy, done),
        retry=retry_if_exception_type(RetryableError),
        reraise=True,
    )


async def with_transport_retries(
    policy: RetryPolicy, call: Callable[[], Awaitable[T]], sleep: Sleep = asyncio.sleep
) -> T:
    """`call()` until it succeeds or a non-retryable error, at most policy.max_attempts times.

    The first attempt runs bare: tenacity's per-call set-up costs ~40 us, most requests succeed at
    once, and the same schedule (backoff after attempt 1, then tenacity) follows a first failure.
    `sleep` waits between attempts (tests pass one that records the waits).
    """
    try:
        return await call()
    except RetryableError as exc:
        if policy.max_attempts <= 1:
            raise
        await sleep(backoff_delay(policy, 1, _retry_after(exc)))
    async for attempt in transport_retrying(policy, done=1, sleep=sleep):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity reraises the last error")
