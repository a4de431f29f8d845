"""Retry decisions as small pure functions, and the tenacity strategies built from them.

Two kinds of retry are kept apart. Transport trouble (refused, reset, timeout, 5xx, 429, 503) backs
off and moves to another server with the same request. A context-length 400 changes the request:
its budget is recomputed from the server's own numbers (tokens.budget.rebudget), and that uses up one
budget attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from ..config import RetryPolicy
from ..errors import OverloadedError, RetryableError

T = TypeVar("T")


def backoff_delay(policy: RetryPolicy, attempt: int, retry_after: float | None = None) -> float:
    """Seconds to wait before transport attempt `attempt + 1` (attempt counts from 1)."""
    if retry_after is not None:
        return min(retry_after, policy.max_retry_after)
    base = min(policy.initial_delay * 2 ** (attempt - 1), policy.max_delay)
    return float(base * (0.5 + policy.jitter.random() / 2))  # jitter in [base/2, base]


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
