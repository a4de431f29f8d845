"""Pure retry decisions (backoff) and the transport retry loop; re-budgeting is in test_budget.py."""

from __future__ import annotations

import asyncio
import random

import pytest

from gen_pipeline.config import RetryPolicy
from gen_pipeline.errors import BadRequestError, OverloadedError, ServerError
from gen_pipeline.send.retry import backoff_delay, with_transport_retries


def test_backoff_grows_is_capped_and_honours_retry_after():
    """Delays double from the initial value, stay under the cap, and obey Retry-After."""
    policy = RetryPolicy(initial_delay=0.5, max_delay=4.0, jitter=random.Random(1))
    delays = [backoff_delay(policy, n) for n in range(1, 8)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert delays[-1] >= 2.0
    assert backoff_delay(policy, 1, retry_after=7.0) == 7.0
    assert backoff_delay(policy, 1, retry_after=1e6) == policy.max_retry_after
    assert backoff_delay(RetryPolicy.testing(), 5) == 0.0


class Script:
    """A call that fails with the given errors in turn, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def fast_policy(**kw) -> RetryPolicy:
    return RetryPolicy(initial_delay=0.001, max_delay=0.002, **kw)


@pytest.mark.parametrize("failures", [0, 1, 2, 4])
def test_transport_retries_try_again_until_success(failures):
    call = Script(*[ServerError("HTTP 500", server="s", status=500) for _ in range(failures)])
    assert asyncio.run(with_transport_retries(fast_policy(max_attempts=5), call)) == "ok"
    assert call.calls == failures + 1


def test_transport_retries_stop_at_max_attempts_with_the_last_error():
    errors = [ServerError(f"HTTP 500 #{i}", server="s", status=500) for i in range(5)]
    call = Script(*errors)
    with pytest.raises(ServerError, match="#2"):
        asyncio.run(with_transport_retries(fast_policy(max_attempts=3), call))
    assert call.calls == 3
    single = Script(ServerError("HTTP 502", server="s", status=502))
    with pytest.raises(ServerError):
        asyncio.run(with_transport_retries(fast_policy(max_attempts=1), single))
    assert single.calls == 1


def test_a_fatal_error_is_not_retried():
    call = Script(BadRequestError("HTTP 400: bad", server="s", status=400))
    with pytest.raises(BadRequestError):
        asyncio.run(with_transport_retries(fast_policy(max_attempts=5), call))
    assert call.calls == 1


def test_retry_after_sets_the_wait_before_the_next_attempt():
    """A 429's Retry-After is the wait before the next attempt, on the first failure and on later ones."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    first = Script(OverloadedError("HTTP 429", server="s", status=429, retry_after=0.3))
    assert asyncio.run(with_transport_retries(fast_policy(max_attempts=3), first, sleep)) == "ok"
    again = Script(ServerError("HTTP 503", server="s", status=503),
                   OverloadedError("HTTP 429", server="s", status=429, retry_after=0.7))  # fmt: skip
    assert asyncio.run(with_transport_retries(fast_policy(max_attempts=3), again, sleep)) == "ok"
    assert waits[0] == 0.3 and waits[2] == 0.7
    assert len(waits) == 3
