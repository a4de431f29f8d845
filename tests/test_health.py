"""Health decisions as tables: what a failure cost, whether a server is worth it, lock-outs, stalls."""

from __future__ import annotations

import pytest

from gen_pipeline.errors import (
    BadRequestError,
    ConnectError,
    ConnectionLostError,
    OverloadedError,
    RequestError,
    RequestTimeout,
    ServerError,
)
from gen_pipeline.fleet import health
from gen_pipeline.fleet.health import Cost, Window


@pytest.mark.parametrize(
    ("error", "held", "mean", "cost"),
    [
        (BadRequestError("400"), 0.01, 1.0, Cost.NONE),
        (ConnectError("refused"), 0.0, None, Cost.DEAD),
        (RequestTimeout("timeout"), 120.0, 1.0, Cost.EXPENSIVE),
        (OverloadedError("queue full", status=503), 5.0, 1.0, Cost.CHEAP),
        (ServerError("502", status=502), 0.003, None, Cost.CHEAP),
        (ServerError("502", status=502), 0.003, 0.6, Cost.CHEAP),
        (ServerError("500", status=500), 0.6, None, Cost.EXPENSIVE),
        (ServerError("500", status=500), 0.6, 10.0, Cost.CHEAP),  # a tenth of a 10 s request
        (ServerError("500", status=500), 2.0, 10.0, Cost.EXPENSIVE),
        (ServerError("500", status=500), None, 1.0, Cost.CHEAP),  # held time unknown
        (ConnectionLostError("reset"), 0.01, 1.0, Cost.CHEAP),
        (ConnectionLostError("reset"), 30.0, 1.0, Cost.EXPENSIVE),
    ],
)
def test_failure_cost(error: RequestError, held: float | None, mean: float | None, cost: Cost) -> None:
    """A failure is cheap when it came back at once, expensive when it held a slot, dead when refused."""
    assert health.failure_cost(error, held, mean) is cost


@pytest.mark.parametrize(
    ("useful", "wasted", "evidence", "keep"),
    [
        (0.0, 0.25, 4.0, True),  # too little evidence to judge
        (0.0, 0.25, 5.0, False),  # nothing but failures
        (4.2, 0.16, 10.0, True),  # 30% instant 502s at 0.6 s per success
        (0.6, 0.47, 10.0, True),  # 90% instant 502s: still mostly useful slot time
        (3.0, 3.0, 10.0, True),  # half the work wasted by 500s after work
        (1.0, 4.0, 10.0, False),  # four fifths wasted
    ],
)
def test_worth_keeping(useful: float, wasted: float, evidence: float, keep: bool) -> None:
    """A server stays in use while its successes hold at least MIN_EFFICIENCY of its recent slot time."""
    window = Window(useful_s=useful, wasted_s=wasted, evidence=evidence)
    assert health.worth_keeping(window) is keep


@pytest.mark.parametrize(
    ("cost", "in_a_row", "trial", "out"),
    [
        (Cost.NONE, 9, True, False),
        (Cost.DEAD, 0, False, True),
        (Cost.CHEAP, 0, False, False),
        (Cost.CHEAP, 0, True, True),  # a failed trial
        (Cost.EXPENSIVE, health.EXPENSIVE_IN_A_ROW - 1, False, False),
        (Cost.EXPENSIVE, health.EXPENSIVE_IN_A_ROW, False, True),
    ],
)
def test_should_take_out(cost: Cost, in_a_row: int, trial: bool, out: bool) -> None:
    """Refused, a failed trial, or expensive failures in a row take a server out; one cheap failure does not."""
    window = Window(useful_s=10.0, evidence=20.0)
    assert health.should_take_out(cost, in_a_row, window, trial) is out


@pytest.mark.parametrize(
    ("cooldown", "cost", "after"),
    [
        (1.0, Cost.CHEAP, 1.0),
        (1.0, Cost.EXPENSIVE, 2.0),
        (16.0, Cost.DEAD, health.MAX_COOLDOWN),
        (4.0, Cost.CHEAP, 4.0),
    ],
)
def test_next_cooldown(cooldown: float, cost: Cost, after: float) -> None:
    """Only expensive failures and refusals lengthen the lock-out."""
    assert health.next_cooldown(cooldown, cost) == after


@pytest.mark.parametrize(
    ("in_flight", "quiet", "slowest", "stalled"),
    [
        (0, 999.0, 1.0, False),
        (4, 999.0, None, False),
        (4, 9.0, 1.0, False),
        (4, 11.0, 1.0, True),
        (4, 20.0, 8.0, False),
    ],
)
def test_stalled(in_flight: int, quiet: float, slowest: float | None, stalled: bool) -> None:
    """Silent with work in flight for far longer than its slowest success: hanging."""
    assert health.stalled(in_flight, quiet, slowest) is stalled


def test_window_decays_with_time() -> None:
    """Old outcomes fade: after one half-life a window counts half of what it had."""
    window = Window(at=0.0)
    window.add(0.0, useful_s=4.0)
    window.add(health.HALF_LIFE_S, wasted_s=1.0)
    assert (window.useful_s, window.wasted_s, window.evidence) == (2.0, 1.0, 1.5)
