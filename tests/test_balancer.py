"""The balancer: earliest completion, never back to the server that just failed, breakers that weigh cost."""

from __future__ import annotations

import asyncio
import random

import pytest

from gen_pipeline.errors import BadRequestError, ConnectError, OverloadedError, RequestTimeout, ServerError
from gen_pipeline.fleet import health
from gen_pipeline.fleet.affinity import chain
from gen_pipeline.fleet.balancer import ServerPool, ServerState
from gen_pipeline.fleet.pacing import queue_margin


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(*caps: int, clock=None) -> ServerPool:
    return ServerPool((ServerState(f"s{i}", c) for i, c in enumerate(caps)), clock or Clock())


def bad_gateway() -> ServerError:
    return ServerError("502 Bad Gateway", status=502)


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


def test_queue_margin_keeps_requests_waiting_at_the_server():
    """With a margin a server takes that many requests beyond its running slots; a queue-full 503 ends it."""
    p = ServerPool([ServerState("s0", 16, margin=queue_margin(16))], Clock())
    s0 = p.servers[0]
    assert s0.limit == 18
    s0.in_flight = 17
    assert p.pick() is s0
    p.record_failure(s0, OverloadedError("The request queue is full.", status=503), started=p.clock())
    assert s0.margin == 0 and p.pick() is None


def test_retry_avoids_the_failed_server_while_another_is_healthy():
    """The excluded server is not picked while any other healthy one exists, even if busy."""
    p = pool(2, 1)
    assert p.pick(frozenset({"s0"})).url == "s1"
    p.servers[1].in_flight = 1  # s1 busy but healthy: wait rather than go back to s0
    assert p.pick(frozenset({"s0"})) is None
    p.record_failure(p.servers[1], ConnectError("x"))  # s1 is down now: s0 is all there is
    assert p.pick(frozenset({"s0"})).url == "s0"


def test_expensive_failures_in_a_row_open_the_breaker_then_half_open_trial():
    """Expensive failures in a row take a server out; after the cooldown one trial request decides."""
    clock = Clock()
    p = pool(8, 8, clock=clock)
    s0 = p.servers[0]
    for _ in range(health.EXPENSIVE_IN_A_ROW - 1):
        p.record_failure(s0, RequestTimeout("timed out"), started=clock() - 60)
    assert s0.available(clock())
    p.record_failure(s0, RequestTimeout("timed out"), started=clock() - 60)
    assert not s0.available(clock()) and [s.url for s in p.healthy()] == ["s1"]
    clock.now += health.INITIAL_COOLDOWN + 0.01
    assert s0.available(clock()) and s0.trial
    s0.in_flight = s0.trial_in_flight = 1
    assert not s0.available(clock())  # half-open: one fresh request at a time
    p.record_success(s0, 0.1, 5, started=clock() - 0.1)
    assert not s0.trial and s0.cooldown == health.INITIAL_COOLDOWN
    assert s0.out_of_service(clock()) == pytest.approx(health.INITIAL_COOLDOWN)


def test_a_mostly_fine_server_answering_instant_502s_stays_in_use():
    """30% of requests answered at once with a 502 cost nearly nothing: the server is never taken out."""
    clock = Clock()
    p = pool(16, clock=clock)
    s0 = p.servers[0]
    for i in range(2000):
        clock.now += 0.02
        if i % 10 < 3:
            p.record_failure(s0, bad_gateway(), started=clock() - 0.002)
        else:
            p.record_success(s0, 0.6, 300, started=clock() - 0.6)
        assert s0.available(clock()) and not s0.trial
    assert s0.out_of_service(clock()) == 0.0 and s0.failures["server_error"] == 600


def test_a_server_failing_everything_cheaply_is_taken_out_and_its_lockout_never_grows():
    """Only instant 502s: out once two waves of them are in; failed trials keep the first cooldown."""
    clock = Clock()
    p = pool(16, clock=clock)
    s0 = p.servers[0]
    sent = 0
    while s0.available(clock()):
        sent += 1
        p.record_failure(s0, bad_gateway(), started=clock())
    assert sent == 2 * s0.limit + 1  # judged after two waves of its slots (or two latencies)
    for _ in range(5):
        clock.now = s0.down_until
        assert s0.available(clock()) and s0.trial
        p.record_failure(s0, bad_gateway(), started=clock())
        assert s0.down_until == clock() + health.INITIAL_COOLDOWN


def test_failures_of_requests_sent_before_the_breaker_opened_do_not_retrip_it():
    """A burst of in-flight failures after the breaker opens neither extends nor doubles its lock-out."""
    clock = Clock()
    p = pool(16, clock=clock)
    s0 = p.servers[0]
    sent = clock() - 30  # sixteen requests, all in flight since then
    for _ in range(health.EXPENSIVE_IN_A_ROW):
        p.record_failure(s0, RequestTimeout("timed out"), started=sent)
    opened_until, cooldown = s0.down_until, s0.cooldown
    for _ in range(16 - health.EXPENSIVE_IN_A_ROW):
        clock.now += 0.05
        p.record_failure(s0, RequestTimeout("timed out"), started=sent)
    assert (s0.down_until, s0.cooldown) == (opened_until, cooldown)
    assert s0.failures["timeout"] == 16


def test_a_success_clears_the_lockout():
    """A 200 that arrives while a server is out ends the lock-out at once (one trial request at a time)."""
    clock = Clock()
    p = pool(16, clock=clock)
    s0 = p.servers[0]
    for _ in range(health.EXPENSIVE_IN_A_ROW):
        p.record_failure(s0, RequestTimeout("timed out"), started=clock() - 30)
    clock.now += 0.3
    p.record_success(s0, 29.0, 10, started=clock() - 29)  # sent before it opened
    assert s0.available(clock()) and s0.trial
    assert s0.out_of_service(clock()) == pytest.approx(0.3)


def test_a_dead_server_waits_for_a_probe_and_counts_as_out_of_service_all_along():
    """Refused connections take a server out until a probe answers; its open period is reported."""
    clock = Clock()
    p = pool(4, 4, clock=clock)
    s0 = p.servers[0]
    p.mark_down(s0)
    clock.now += 120
    p.record_probe(s0, False, 1.0)
    assert not s0.available(clock()) and p.out_of_service() == [s0]
    assert p.views()["s0"]["out_of_service_s"] == 120.0
    p.record_probe(s0, True, 1.0)
    assert s0.available(clock()) and s0.trial and p.out_of_service() == []


def test_refused_requests_are_not_counted_as_requests_the_server_received():
    """A refused connection never reached the server: its request count stays what the server saw."""

    async def scenario():
        p = ServerPool([ServerState("s0", 2), ServerState("s1", 2)], Clock())
        async with p.lease() as server:
            p.record_failure(server, ConnectError("refused"))
        return p.servers[0].requests, p.servers[0].failures["connection"]

    assert asyncio.run(asyncio.wait_for(scenario(), 5)) == (0, 1)


def test_bad_request_does_not_count_against_the_server():
    """A 400 is the request's fault; it never opens the breaker."""
    p = pool(1)
    for _ in range(10):
        p.record_failure(p.servers[0], BadRequestError("no"), started=p.clock())
    assert p.servers[0].available(p.clock()) and p.servers[0].failures["bad_request"] == 10


def test_a_silent_server_with_work_in_flight_gets_no_new_request():
    """Far longer than its slowest success without any answer: treated as hanging until it answers."""
    clock = Clock()
    p = pool(4, 4, clock=clock)
    s0 = p.servers[0]
    p.record_success(s0, 2.0, 10)
    s0.in_flight = 1
    clock.now += health.STALL_FLOOR_S + 1
    assert not s0.available(clock()) and p.pick() is p.servers[1]
    p.record_success(s0, 2.0, 10)
    assert s0.available(clock())


def slow_and_fast(backlog: int | None) -> ServerPool:
    """A fast and a 4x slower server, the fast one full; `backlog` prompts still to send (None: the input is
    not exhausted)."""
    p = pool(4, 4)
    fast, slow = p.servers
    fast.mean_latency, slow.mean_latency = 1.0, 4.0
    fast.in_flight = fast.limit
    if backlog is not None:
        p.begin_tail(lambda: backlog)
    return p


@pytest.mark.parametrize(("backlog", "picked"), [(None, "s1"), (100, "s1"), (20, "s1"), (10, None), (0, None)])
def test_near_the_end_a_slow_server_gets_no_new_request(backlog, picked):
    """With little left to send, waiting for the fast server beats starting on the slow one."""
    p = slow_and_fast(backlog)  # None: the input is not exhausted, every slot is worth filling
    server = p.pick()
    assert (server.url if server else None) == picked


def test_equal_servers_are_never_held_back_at_the_end():
    """On a fleet of equal servers the tail rule leaves every free slot in use."""
    p = pool(4, 4)
    for s in p.servers:
        s.mean_latency = 1.0
    p.servers[0].in_flight = 4
    p.begin_tail(lambda: 0)
    assert p.pick() is p.servers[1]


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
    """The waiter is woken by the release itself, within a few loop turns, not by its periodic re-check."""

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


@pytest.mark.parametrize(("tail", "first"), [(False, 100), (True, 500)])
def test_a_freed_slot_goes_to_the_oldest_waiter_and_in_the_tail_to_the_longest(tail, first):
    """While input remains, leases are served in turn; once it is exhausted, the longest waiting request
    starts first, so the run does not end waiting on a long one started last."""

    async def scenario():
        p = ServerPool([ServerState("s0", 1)])
        if tail:
            p.begin_tail(lambda: 0)
        order: list[int] = []

        async def take(size: int) -> None:
            async with p.lease(size=size):
                order.append(size)

        async with p.lease():
            waiters = [asyncio.create_task(take(size)) for size in (100, 500, 300)]
            await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert order[0] == first and p.servers[0].in_flight == 0

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_in_the_tail_a_retry_goes_first_then_the_longest_then_the_oldest_and_nothing_stays_indexed():
    """Once the input is exhausted a retry (a lease avoiding the server that failed it) takes the first slot,
    then the longest, of one size the oldest first; leases that leave, served or cancelled, leave the pool's
    queue indexes (by size, by prefix group, retries) empty."""

    async def scenario():
        p = ServerPool([ServerState("s0", 1), ServerState("s1", 1)])
        p.begin_tail(lambda: 0)
        order: list[str] = []

        async def take(name: str, size: int, exclude: frozenset[str] = frozenset()) -> None:
            async with p.lease(exclude=exclude, size=size):
                order.append(name)
                await asyncio.sleep(0.01)

        p.servers[1].down_until = float("inf")  # one server: slots free one at a time
        async with p.lease():
            waiters = [
                asyncio.create_task(take(name, size, exclude))
                for name, size, exclude in [
                    ("short", 100, frozenset()),
                    ("long-a", 500, frozenset()),
                    ("retry", 50, frozenset({"s1"})),
                    ("long-b", 500, frozenset()),
                ]
            ]
            gone = asyncio.create_task(take("cancelled", 900))
            await asyncio.sleep(0.01)
            assert p.queue.special == 1 and sorted(p.queue._by_size) == [50, 100, 500, 900]
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert order == ["retry", "long-a", "long-b", "short"]
        q = p.queue
        assert (q._leases, q._by_size, q._groups, q.special, q.linked) == ([], {}, {}, 0, 0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_near_the_end_a_slow_server_takes_a_short_request_but_not_a_long_one():
    """The tail rule weighs the request in hand at the server's seconds per token."""
    p = pool(4, 4)
    fast, slow = p.servers
    for server, per_token in ((fast, 0.01), (slow, 0.04)):
        p.record_success(server, 300 * per_token, 300)
    fast.in_flight = fast.limit
    p.begin_tail(lambda: 4)  # the fast server drains those and this one in 5 / (4 / 3 s) = 3.75 s
    assert p.pick(size=64) is slow  # 2.6 s there
    assert p.pick(size=500) is None  # 20 s there


async def _hold(p: ServerPool, seconds: float = 0.0) -> None:
    async with p.lease():
        await asyncio.sleep(seconds)


def test_full_outage_waits_then_resumes():
    """With every server down the lease waits (nothing fails) and proceeds once one returns."""

    async def scenario():
        clock = Clock()
        p = ServerPool([ServerState("s0", 2)], clock)
        for _ in range(health.EXPENSIVE_IN_A_ROW):
            p.record_failure(p.servers[0], RequestTimeout("x"))  # down for the first cooldown
        task = asyncio.create_task(_hold(p))
        for _ in range(5):
            await asyncio.sleep(0)  # the lease is queued
        clock.now += 0.3
        assert not task.done() and p.outage_seconds() == pytest.approx(0.3)
        clock.now += health.INITIAL_COOLDOWN
        await asyncio.wait_for(task, 3)  # its next look (every POLL_S) finds the lock-out over
        assert p.servers[0].requests == 1

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_tail_is_last_dispatch_to_last_completion():
    """The summary's tail runs from the last request sent to the last one completed."""

    async def scenario():
        clock = Clock()
        p = ServerPool([ServerState("s0", 2)], clock)
        async with p.lease() as s:
            clock.now += 3.0
            p.record_success(s, 3.0, 10)
        return p.tail_seconds()

    assert asyncio.run(asyncio.wait_for(scenario(), 5)) == 3.0


def test_a_server_left_idle_by_the_tail_rule_is_judged_again_after_a_while():
    """A slow spell is forgotten once the server has had nothing to do for several of its requests' time:
    it gets a request again, and its next answer alone sets its speed."""
    clock = Clock()
    p = pool(4, 4, clock=clock)
    fast, slow = p.servers
    p.record_success(fast, 3.0, 300)
    p.record_success(slow, 12.0, 300)  # a slow spell: 0.04 s per token
    fast.in_flight = fast.limit
    p.begin_tail(lambda: 4)
    assert p.pick(size=500) is None  # 20 s there, against 3.75 s for the fast server
    clock.now += 61.0  # over 3 x 20 s without an answer
    assert p.pick(size=500) is slow
    p.record_success(slow, 3.0, 300)
    assert slow.speed.per_token == pytest.approx(0.01)


def test_a_freed_slot_in_the_tail_costs_few_looks_however_many_wait():
    """Once the input is exhausted the longest waiting lease the tail rule lets start is found by bisection:
    a slot on a slow server with hundreds of long requests waiting is not offered to each of them."""

    class Counting(ServerPool):
        looks = 0

        def pick(self, *args, **kw):
            Counting.looks += 1
            return super().pick(*args, **kw)

    async def scenario():
        p = Counting([ServerState("fast", 400), ServerState("slow", 4)], Clock())
        fast, slow = p.servers
        p.record_success(fast, 3.0, 300)
        p.record_success(slow, 12.0, 300)
        fast.in_flight, slow.in_flight = fast.limit, slow.limit
        p.begin_tail(lambda: 0)
        sizes = [500 - i for i in range(400)] + [20]  # only the last fits on the slow server
        hold = asyncio.Event()
        started: list[int] = []
        waiters = [asyncio.create_task(_hold_sized(p, size, hold, started)) for size in sizes]
        await asyncio.sleep(0.01)
        Counting.looks = 0
        slow.in_flight -= 1
        p.queue.hand_out()
        await asyncio.sleep(0.01)
        looks, slow_in_flight = Counting.looks, slow.in_flight
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        return looks, started, slow_in_flight

    looks, started, slow_in_flight = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert started == [20] and slow_in_flight == 4
    assert looks <= 12  # a look at each waiter would be 401


async def _hold_sized(p: ServerPool, size: int, hold: asyncio.Event, started: list[int]) -> None:
    async with p.lease(size=size):
        started.append(size)
        await hold.wait()


@pytest.mark.parametrize(("fail_every", "out"), [(2, False), (1, True)])
def test_instant_failures_before_the_first_successes_return_do_not_take_a_server_out(fail_every, out):
    """At the start a server's instant 502s come back long before its successes: one failing half its
    requests keeps its place while the first answers are on their way; one failing all of them leaves."""
    clock = Clock()
    p = pool(16, 16, clock=clock)
    p.record_success(p.servers[1], 2.0, 100)  # the fleet's latency: 2 s
    flaky = p.servers[0]
    sent, held = 0, 0  # requests sent; slots held by requests that will succeed (after 2 s)
    while clock.now < 101.5 and flaky.available(clock()):  # 1.5 s of refills every 10 ms
        for _ in range(flaky.capacity - held):
            sent += 1
            if sent % fail_every == 0:
                p.record_failure(flaky, bad_gateway(), started=clock() - 0.01)
            else:
                held += 1
        clock.now += 0.01
    assert (not flaky.available(clock())) is out, (sent, flaky.failures)
    if not out:
        p.record_success(flaky, 2.0, 100, started=clock() - 2.0)  # the first wave's answers come back
        for _ in range(20):
            p.record_failure(flaky, bad_gateway(), started=clock())
            p.record_success(flaky, 2.0, 100, started=clock() - 2.0)
            clock.now += 0.1
        assert flaky.available(clock())


@pytest.mark.parametrize("tail", [False, True])
def test_many_leases_of_every_kind_all_run_and_leave_nothing_queued_or_indexed(tail):
    """Leases of mixed sizes, prefixes, retries and cancels over a small fleet: every one not cancelled runs
    exactly once, the pool's queue indexes always hold exactly the queued leases, and nothing stays behind."""
    rng = random.Random(7)
    systems = [{"role": "system", "content": f"system prompt {g} " * 30} for g in range(4)]

    def indexed(p: ServerPool) -> list[int]:
        return sorted(id(w) for members in p.queue._by_size.values() for w in members)

    async def scenario():
        p = ServerPool([ServerState(f"s{i}", 2) for i in range(3)])
        if tail:
            p.begin_tail(lambda: 0)
        ran: list[int] = []

        async def take(i: int) -> None:
            links = chain([rng.choice(systems), {"role": "user", "content": f"q{i}"}]) if i % 3 else ()
            exclude = frozenset({"s0"}) if i % 7 == 0 else frozenset()
            async with p.lease(exclude=exclude, size=rng.choice([64, 128, 512]), links=links):
                assert indexed(p) == sorted(id(w) for w in p.queue._leases)
                assert sum(map(len, p.queue._groups.values())) == p.queue.linked
                ran.append(i)
                await asyncio.sleep(rng.random() * 0.003)

        tasks = [asyncio.create_task(take(i)) for i in range(300)]
        await asyncio.sleep(0)  # six run, the rest wait: cancel some waiting, then some whatever they do
        cancelled = {i for i in range(0, 300, 11) if tasks[i].cancel()}
        await asyncio.sleep(0.002)
        cancelled |= {i for i in range(0, 300, 13) if not tasks[i].done() and tasks[i].cancel()}
        await asyncio.gather(*tasks, return_exceptions=True)
        assert sorted(ran + [i for i in cancelled if i not in ran]) == list(range(300))
        assert len(ran) == len(set(ran)) and len(cancelled) > 10 and len(ran) > 250
        q = p.queue
        assert (q._leases, q._by_size, q._groups, q.special, q.linked) == ([], {}, {}, 0, 0)
        assert all(s.in_flight == 0 for s in p.servers)

    asyncio.run(asyncio.wait_for(scenario(), 30))
