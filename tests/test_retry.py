"""Pure retry decisions: backoff, re-budgeting from a server's numbers, the learned offset."""

from __future__ import annotations

import random

import pytest

from gen_pipeline.config import RetryPolicy
from gen_pipeline.errors import OverflowCounts
from gen_pipeline.retry import OffsetLearner, backoff_delay, rebudget


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
