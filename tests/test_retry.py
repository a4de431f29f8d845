"""Pure retry decisions: backoff, re-budgeting from a server's numbers, the learned offset."""

from __future__ import annotations

import asyncio
import random

import pytest

from gen_pipeline.config import RetryPolicy
from gen_pipeline.errors import BadRequestError, OverflowCounts, OverloadedError, ServerError
from gen_pipeline.retry import OffsetLearner, backoff_delay, rebudget, with_transport_retries


def test_backoff_grows_is_capped_and_honours_retry_after():
    """Delays double from the initial value, stay under the cap, and obey Retry-After."""
    policy = RetryPolicy(initial_delay=0.5, max_delay=4.0, jitter=random.Random(1))
    delays = [backoff_delay(policy, n) for n in range(1, 8)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert delays[-1] >= 2.0
    assert backoff_delay(policy, 1, retry_after=7.0) == 7.0
    assert backoff_delay(policy, 1, retry_after=1e6) == policy.max_retry_after
    assert backoff_delay(RetryPolicy.testing(), 5) == 0.0


CTX = 8192


@pytest.mark.parametrize(
    ("counts", "sent", "expected"),
    [
        # the server counted 8000 where we counted less: fit under its count
        (OverflowCounts("sglang.total", CTX, 8100, 176), 176, CTX - 8100 - 16),
        # legacy off-by-one: our budget fit by its own numbers; go one lower
        (OverflowCounts("sglang.total", CTX, 8000, 192), 192, 176),
        (OverflowCounts("sglang.input", CTX, 9000), 100, None),  # the prompt alone is too long
        (OverflowCounts("sglang.sched", None, 8190, max_input=8186), 1, None),
        (OverflowCounts("vllm.v018.total", 4096, 300, 4000, lower_bound=True), 4000, None),
        (OverflowCounts("no_counts"), 100, None),
        (OverflowCounts("sglang.total", CTX, CTX - 20, 100), 100, None),  # room below min_tokens
        (
            OverflowCounts("llamacpp.fields", 2048, 1000),
            4000,
            2048 - 1000 - 16,
        ),  # smaller server ctx
    ],
)
def test_rebudget_table(counts, sent, expected):
    """The new budget comes from the server's own counts, or None when none can fit."""
    assert rebudget(counts, sent_max_tokens=sent, context_length=CTX, margin=16, min_tokens=16) == expected


def test_offset_is_learned_after_repeated_evidence():
    """The same positive gap three times becomes the offset; noise and lower bounds do not."""
    learner = OffsetLearner()
    gap = OverflowCounts("sglang.total", CTX, 1006, 10)
    learner.observe(1000, gap)
    learner.observe(500, OverflowCounts("sglang.total", CTX, 503, 10))
    learner.observe(900, OverflowCounts("x", CTX, 1900, lower_bound=True))
    learner.observe(1000, gap)
    assert learner.offset == 0
    learner.observe(2000, OverflowCounts("sglang.total", CTX, 2006, 10))
    assert learner.offset == 6
    learner.observe(10, OverflowCounts("sglang.total", CTX, 100000, 10))  # absurd: ignored
    assert learner.offset == 6


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
