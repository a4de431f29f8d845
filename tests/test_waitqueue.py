"""The wait queue alone: the order free slots go to waiting leases, and its indexes kept in step with it.
The fleet is a fake that hands a lease the first server with room; which server is the pool's business."""

from __future__ import annotations

import asyncio
import random

from gen_pipeline.fleet import affinity
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.fleet.waitqueue import AFFINITY_PATIENCE, Lease, WaitQueue


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FirstFree:
    """A fleet that gives a lease the first server with room it does not avoid (latency 1 s everywhere)."""

    def __init__(self, *capacities: int, tail: bool = False) -> None:
        self.servers = [ServerState(f"s{i}", c) for i, c in enumerate(capacities)]
        self.clock = Clock()
        self.in_tail = tail  # the input is exhausted
        self.queue = WaitQueue(self)

    def latencies(self) -> dict[str, float]:
        return {s.url: 1.0 for s in self.servers}

    def pick(self, exclude=frozenset(), **_: object) -> ServerState | None:
        now = self.clock()
        return next((s for s in self.servers if s.url not in exclude and s.available(now)), None)

    def take(self, lease: Lease, server: ServerState) -> None:
        server.in_flight += 1
        lease.server = server

    def lease(self, size: float = 0.0, exclude: frozenset[str] = frozenset(), links=()) -> Lease:
        lease = Lease(self, exclude, size=size)
        lease.links = links
        return lease


def ask(system: str) -> tuple[affinity.Link, ...]:
    return affinity.chain([{"role": "system", "content": system * 200}, {"role": "user", "content": "q"}])


def granted(leases: list[Lease]) -> list[float]:
    return [w.size for w in leases if w.granted is not None and w.granted.done()]


def test_while_input_remains_a_free_slot_goes_to_the_oldest():
    """Leases take slots in the order they queued, whatever their size."""

    async def scenario() -> None:
        fleet = FirstFree(1)
        fleet.servers[0].in_flight = 1
        leases = [fleet.lease(size) for size in (100, 500, 300)]
        for w in leases:
            fleet.queue.push(w)
        fleet.queue.hand_out()
        assert granted(leases) == [] and len(fleet.queue) == 3  # no slot free
        fleet.servers[0].in_flight = 0
        fleet.queue.hand_out()
        assert granted(leases) == [100] and len(fleet.queue) == 2 and leases[0].server is fleet.servers[0]

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_in_the_tail_a_retry_goes_first_then_the_longest_then_the_oldest():
    """Once the input is exhausted: a lease avoiding a server first, then longest first, of one size in turn."""

    async def scenario() -> None:
        fleet = FirstFree(1, tail=True)
        server = fleet.servers[0]
        server.in_flight = 1
        leases = {
            "short": fleet.lease(100),
            "long-a": fleet.lease(500),
            "retry": fleet.lease(50, exclude=frozenset({"s9"})),
            "long-b": fleet.lease(500),
        }
        for w in leases.values():
            fleet.queue.push(w)
        order = []
        while len(fleet.queue):
            server.in_flight -= 1
            fleet.queue.hand_out()
            order += [name for name, w in leases.items() if w.server is not None and name not in order]
        assert order == ["retry", "long-a", "long-b", "short"]

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_a_lease_waits_for_the_busy_server_holding_its_prefix_until_its_patience_runs_out():
    """A free slot elsewhere goes to a lease behind it; once it has waited AFFINITY_PATIENCE times a lease's
    usual wait, it goes first."""

    async def scenario() -> None:
        for waited, first in ((0.0, "plain"), (None, "held")):
            fleet = FirstFree(1, 1)
            holder, free = fleet.servers
            links = ask("a long system prompt ")
            holder.prefixes.note(links)
            holder.in_flight = 1
            leases = {"held": fleet.lease(links=links), "plain": fleet.lease()}
            for w in leases.values():
                fleet.queue.push(w)
            patience = fleet.queue.patience()
            assert patience == AFFINITY_PATIENCE * 1.0 * (1 + 2 / 2)  # a latency, the queue over the slots
            fleet.clock.now += patience + 0.1 if waited is None else waited
            fleet.queue.hand_out()
            assert [name for name, w in leases.items() if w.server is free] == [first]

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_push_and_remove_keep_every_index_in_step():
    """Leases of every kind queued and removed in any order: the indexes always hold exactly the queued ones,
    and nothing stays behind."""

    async def scenario() -> None:
        rng = random.Random(3)
        fleet = FirstFree(1)
        queue = fleet.queue
        prompts = [ask(f"system {g} ") for g in range(3)] + [()]
        queued: list[Lease] = []
        for step in range(400):
            if queued and rng.random() < 0.45:
                lease = queued.pop(rng.randrange(len(queued)))
                queue.remove(lease)
                queue.remove(lease)  # a second remove (a lease granted, then left) changes nothing
            else:
                exclude = frozenset({"s0"}) if step % 5 == 0 else frozenset()
                lease = fleet.lease(rng.choice([64.0, 128.0, 512.0]), exclude, rng.choice(prompts))
                queue.push(lease)
                queued.append(lease)
            assert len(queue) == len(queued)
            assert sorted(id(w) for ws in queue._by_size.values() for w in ws) == sorted(map(id, queued))
            assert sorted(id(w) for ws in queue._groups.values() for w in ws) == sorted(
                id(w) for w in queued if w.links
            )
            assert queue.linked == sum(bool(w.links) for w in queued)
            assert queue.special == sum(bool(w.exclude) for w in queued)
        for lease in queued:
            queue.remove(lease)
        assert (len(queue), queue._by_size, queue._groups, queue.special, queue.linked) == (0, {}, {}, 0, 0)

    asyncio.run(asyncio.wait_for(scenario(), 5))
