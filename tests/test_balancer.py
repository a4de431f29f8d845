"""The balancer: least loaded by capacity, never back to the server that just failed, breakers."""

from __future__ import annotations

import asyncio

from gen_pipeline.balancer import FAILURE_THRESHOLD, ServerPool, ServerState
from gen_pipeline.errors import BadRequestError, ConnectError, ServerError


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(*caps: int, clock=None) -> ServerPool:
    return ServerPool((ServerState(f"s{i}", c) for i, c in enumerate(caps)), clock or Clock())


def test_least_loaded_relative_to_capacity():
    """A server with four times the capacity takes four times the concurrent work."""
    p = pool(4, 1)
    picks = []
    for _ in range(5):
        s = p.pick()
        s.in_flight += 1
        picks.append(s.url)
    assert picks.count("s0") == 4 and picks.count("s1") == 1
    assert p.pick() is None  # everything at capacity


def test_retry_avoids_the_failed_server_while_another_is_healthy():
    """The excluded server is not picked while any other healthy one exists, even if busy."""
    p = pool(2, 1)
    assert p.pick(frozenset({"s0"})).url == "s1"
    p.servers[1].in_flight = 1  # s1 busy but healthy: wait rather than go back to s0
    assert p.pick(frozenset({"s0"})) is None
    p.record_failure(p.servers[1], ConnectError("x"))  # s1 is down now: s0 is all there is
    assert p.pick(frozenset({"s0"})).url == "s0"


def test_breaker_opens_then_half_open_trial():
    """Consecutive failures take a server out; after the cooldown one trial request decides."""
    clock = Clock()
    p = pool(8, 8, clock=clock)
    s0 = p.servers[0]
    for _ in range(FAILURE_THRESHOLD - 1):
        p.record_failure(s0, ServerError("500"))
    assert s0.available(clock())
    p.record_failure(s0, ServerError("500"))
    assert not s0.available(clock()) and [s.url for s in p.healthy()] == ["s1"]
    clock.now += 1.01
    assert s0.available(clock()) and s0.trial
    s0.in_flight = 1
    assert not s0.available(clock())  # half-open: one request at a time
    p.record_success(s0, 0.1, 5)
    assert not s0.trial and s0.available(clock()) and s0.out_of_service_s > 1.0


def test_bad_request_does_not_count_against_the_server():
    """A 400 is the request's fault; it never opens the breaker."""
    p = pool(1)
    for _ in range(10):
        p.record_failure(p.servers[0], BadRequestError("no"))
    assert p.servers[0].available(p.clock()) and p.servers[0].failures["bad_request"] == 10


def test_lease_waits_for_capacity_and_releases_on_cancel():
    """A lease blocks while all slots are taken and frees its slot even when cancelled."""

    async def scenario():
        p = ServerPool([ServerState("s0", 1)])
        async with p.lease() as s:
            waiter = asyncio.create_task(_hold(p))
            await asyncio.sleep(0.05)
            assert not waiter.done() and s.in_flight == 1
        await asyncio.wait_for(waiter, 2)
        blocked = asyncio.create_task(_hold(p, 10))
        await asyncio.sleep(0.05)
        blocked.cancel()
        await asyncio.gather(blocked, return_exceptions=True)
        assert p.servers[0].in_flight == 0

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_release_hands_the_slot_to_a_waiting_lease_at_once():
    """The waiter is woken by the release itself, within a few loop turns, not by its 50 ms re-check."""

    async def scenario():
        p = ServerPool([ServerState("s0", 1)])
        async with p.lease():
            waiter = asyncio.create_task(_hold(p, 10))
            await asyncio.sleep(0.01)
            assert p.servers[0].requests == 1
        for _ in range(10):
            await asyncio.sleep(0)
        assert p.servers[0].requests == 2 and p.servers[0].in_flight == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert p.servers[0].in_flight == 0

    asyncio.run(asyncio.wait_for(scenario(), 10))


async def _hold(p: ServerPool, seconds: float = 0.0) -> None:
    async with p.lease():
        await asyncio.sleep(seconds)


def test_full_outage_waits_then_resumes():
    """With every server down the lease waits (nothing fails) and proceeds once one returns."""

    async def scenario():
        p = ServerPool([ServerState("s0", 2)])
        p.record_failure(p.servers[0], ConnectError("refused"))  # down for the 1 s cooldown
        task = asyncio.create_task(_hold(p))
        await asyncio.sleep(0.3)
        assert not task.done() and p.outage_seconds() > 0.2
        await asyncio.wait_for(task, 3)
        assert p.servers[0].requests == 1

    asyncio.run(asyncio.wait_for(scenario(), 10))
