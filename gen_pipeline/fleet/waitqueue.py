"""The leases waiting for a slot, and which of them the free slots go to.

While input remains, the oldest first. Once it is exhausted (the tail), the leases avoiding or preferring a
server first (a retry, a conversation's next turn), then the longest (its expected size) that a free slot may
still take, so the run does not end waiting on a long request started last. A lease whose prompt prefix only a
busy server holds waits for a slot there while the others go first, at most AFFINITY_PATIENCE times what a lease
waits anyway; no slot idles meanwhile: the prefix group with the most leases waiting per server holding it
spreads to one more.

Beside the list (oldest first) the queue keeps the indexes its hand-out reads, in step as leases queue and leave
(not rebuilt per slot: with thousands waiting that was the client's CPU): by size (the tail's order), by the
first link of the prefix (the spread step's groups), and how many avoid or prefer a server. The queue says which
lease asks next; which server it gets is the pool's choice (ServerPool.pick).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from . import affinity
from .affinity import Link
from .state import ServerState

# A lease whose prefix only a busy server holds waits for a slot there, and lets the leases whose prefix a free
# server holds go first, for at most this many times the wait of a lease in turn; then it goes first, anywhere.
AFFINITY_PATIENCE = 2.0


class Slots(Protocol):
    """The fleet as the queue and its leases see it: ServerPool."""

    servers: list[ServerState]
    clock: Callable[[], float]

    @property
    def in_tail(self) -> bool: ...

    def latencies(self) -> dict[str, float]: ...

    def pick(
        self,
        exclude: frozenset[str] = ...,
        waiting: bool = ...,
        prefer: str | None = ...,
        size: float = ...,
        home: bool = ...,
        links: tuple[Link, ...] = ...,
        patient: bool = ...,
    ) -> ServerState | None: ...

    def take(self, lease: Lease, server: ServerState) -> None: ...

    async def acquire(self, lease: Lease) -> ServerState: ...

    def release(self, lease: Lease, server: ServerState, keep: bool = False) -> None: ...


class WaitQueue:
    """The leases waiting for a slot on `slots`, oldest first: push, remove, and `hand_out` the free slots."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self._leases: list[Lease] = []
        self._by_size: dict[float, list[Lease]] = {}
        self._groups: dict[bytes, list[Lease]] = {}
        self.special = 0  # of them, those avoiding or preferring a server (served first in the tail)
        self.linked = 0  # those with a prompt prefix (Lease.links): none, no affinity step to take
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._leases)

    def push(self, lease: Lease) -> asyncio.Future[ServerState]:
        """Queue `lease` behind the others; the future `hand_out` completes with its server."""
        granted = lease.granted = asyncio.get_running_loop().create_future()
        lease.queued_at = self.slots.clock()
        lease.seq = next(self._seq)
        self._leases.append(lease)
        lease.queued = True
        self.linked += bool(lease.links)
        self._by_size.setdefault(lease.size, []).append(lease)
        if lease.links:
            self._groups.setdefault(lease.links[0].digest, []).append(lease)
        self.special += _special(lease)
        return granted

    def remove(self, lease: Lease) -> None:
        """Take `lease` off the queue (given a slot, or gone), if it is still on it."""
        if lease.queued:
            lease.queued = False
            self._leases.remove(lease)
            self.linked -= bool(lease.links)
            _unindex(self._by_size, lease.size, lease)
            if lease.links:
                _unindex(self._groups, lease.links[0].digest, lease)
            self.special -= _special(lease)

    def hand_out(self) -> None:
        """Give free slots to queued leases: the oldest first or, once the input is exhausted, the longest (its
        expected size) that may still start, so the run does not end waiting on a long request started last."""
        now, servers = self.slots.clock(), self.slots.servers
        # room kept for conversations' next turns counts: their leases may be the ones waiting
        free = sum(max(0, s.limit - s.in_flight) for s in servers if s.available(now, own_home=True))
        if not self._leases or not free:
            return
        if not self.slots.in_tail:
            while True:
                for lease in self._cached_first(now):  # one refused here has its server excluded, or a busy one
                    if not (free := free - self._grant(lease)):
                        return
                # No slot idles while leases wait for their prefix: the group with the most waiting per server
                # holding it spreads to one more (then its other leases find a free holder: the loop again).
                if not self.linked:
                    return
                spread = self._widest_group(now)
                if spread is None or not self._grant(spread, patient=False):
                    return
                free -= 1
        linked = self.linked > 0
        later = self._elsewhere(now, self._leases) if linked else None
        if self.special:  # leases avoiding or preferring a server first, longest first
            special = [w for w in self._leases if _special(w)]
            special.sort(key=_size, reverse=True)  # (stable: of one size the oldest first)
            for lease in special:
                if not (free := free - self._grant(lease)):
                    return
        free = self._fit(free, later)
        while linked and free and self._groups:  # no slot idles while they wait: the widest group spreads
            spread = self._widest_group(now, tail=True)
            if spread is None or not self._grant(spread, patient=False):
                self._fit(free, None, patient=False)  # the tail rule refused it: any that fits
                return
            later = self._elsewhere(now, self._leases)  # the server it spread to now holds that group's prefix
            free = self._fit(free - 1, later)

    def _fit(self, free: int, later: Callable[[Lease], bool] | None, patient: bool | None = None) -> int:
        """In the tail: grant queued leases, longest first (of one size the oldest first), while free slots may
        take them now; the free slots left. A lease `later` says waits for the busy server holding its prefix
        is passed over (pick would refuse it), as are leases avoiding or preferring a server (served before)."""
        sizes = sorted(self._by_size, reverse=True)
        start = 0
        while free and (found := self._longest_fit(sizes, start)) is not None:
            start = found + 1
            for lease in self._by_size.get(sizes[found], []).copy():  # a copy: grants take leases off it
                if _special(lease) or (later is not None and later(lease)):
                    continue
                if self._grant(lease, patient):
                    free -= 1
                    if not free or self.slots.pick(waiting=True, size=sizes[found]) is None:
                        break  # no more of this size fits now: a shorter one may
        return free

    def _cached_first(self, now: float) -> Iterator[Lease]:
        """The queued leases that may take a free slot now, oldest first: those not waiting for the busy server
        that holds their prefix (pick would refuse them; the spread step, `_widest_group`, serves those). Looked
        at lazily, from a copy (grants take leases off the queue): a slot is usually taken by one of the first."""
        queue = self._leases.copy()
        if not self.linked:  # none waits for a prefix: the queue in order
            yield from queue
            return
        later = self._elsewhere(now, queue)
        yield from (w for w in queue if not later(w))

    def _elsewhere(self, now: float, leases: list[Lease]) -> Callable[[Lease], bool]:
        """Whether a lease waits for the busy server that holds its prefix, as `pick` would have it: no server
        it could go to now holds any (a free running slot, else before the input is exhausted a queue margin),
        one in service does, and it has not waited AFFINITY_PATIENCE (False for all when no lease has a
        prefix; a lease with a server to avoid or prefer is never held back here)."""
        if not any(w.links for w in leases):
            return lambda lease: False
        available = [s for s in self.slots.servers if s.available(now)]
        tail = self.slots.in_tail
        free = [s for s in available if s.taken() < s.capacity] or ([] if tail else available)
        serving = [s for s in self.slots.servers if now >= s.down_until]
        patience = self.patience()
        groups: dict[bytes, bool] = {}  # by a lease's first link: a prefix group waits or not (a longer link
        # is held only where its first is: the model lets a prefix go before the shorter ones it extends)

        def later(lease: Lease) -> bool:
            if not lease.links or lease.exclude or lease.prefer is not None or now - lease.queued_at > patience:
                return False
            first = lease.links[:1]
            if (waits := groups.get(first[0].digest)) is None:
                waits = groups[first[0].digest] = (
                    affinity.nearest(free, first) is None and affinity.nearest(serving, first) is not None
                )
            return waits

        return later

    def _widest_group(self, now: float, tail: bool = False) -> Lease | None:
        """The first lease of the prefix group (queued leases sharing their first link) with the most leases
        waiting per server in service that likely holds it (ties: the group waiting longest); None: no lease.
        The first lease is the oldest, or `tail`, the longest (then the oldest) of those avoiding and preferring
        no server (the others were served before)."""
        serving = [s for s in self.slots.servers if now >= s.down_until]
        best, best_key = None, None
        for members in self._groups.values():
            waiting = [w for w in members if not _special(w)] if tail and self.special else members
            if not waiting:
                continue
            first = max(waiting, key=_size) if tail and len(self._by_size) > 1 else waiting[0]  # the first longest
            held = sum(s.prefixes.match(first.links[:1]) > 0 for s in serving)
            key = (len(waiting) / max(1, held), -waiting[0].seq)
            if best_key is None or key > best_key:
                best, best_key = first, key
        return best

    def patience(self) -> float:
        """How long a lease may wait for the busy server that holds its prefix: AFFINITY_PATIENCE times what a
        lease waits anyway (a mean latency, and the queue ahead of it over the fleet's running slots)."""
        servers = self.slots.servers
        latency = sum(self.slots.latencies().values()) / max(1, len(servers))
        slots = sum(s.capacity for s in servers)
        return AFFINITY_PATIENCE * latency * (1 + len(self._leases) / max(1, slots))

    def _longest_fit(self, sizes: list[float], start: int) -> int | None:
        """The first of `sizes` (longest first) from `start` that some free slot may take now, by bisection:
        the tail rule refuses a request on a server only more as it grows longer."""
        hi = len(sizes) - 1
        if start > hi or self.slots.pick(waiting=True, size=sizes[hi]) is None:
            return None
        while start < hi:  # sizes[hi] fits; those before `start` do not
            mid = (start + hi) // 2
            if self.slots.pick(waiting=True, size=sizes[mid]) is None:
                start = mid + 1
            else:
                hi = mid
        return hi

    def _grant(self, lease: Lease, patient: bool | None = None) -> int:
        """Give `lease` the best free slot if one may take it now: 1 if given, else 0. `patient`: whether it may
        wait for the busy server holding its prefix (None: while it has not waited AFFINITY_PATIENCE)."""
        if lease.granted is None or lease.granted.done():
            return 0
        if patient is None:  # only a lease with a prefix may wait for its holder (affinity.steer)
            patient = bool(lease.links) and self.slots.clock() - lease.queued_at <= self.patience()
        server = self.slots.pick(
            lease.exclude,
            waiting=True,
            prefer=lease.prefer,
            size=lease.size,
            home=lease.home,
            links=lease.links,
            patient=patient,
        )
        if server is None:
            return 0
        self.remove(lease)
        self.slots.take(lease, server)
        lease.granted.set_result(server)
        return 1


def _size(lease: Lease) -> float:
    return lease.size


def _special(lease: Lease) -> bool:
    """Whether a lease avoids or prefers a server (a retry, a conversation's next turn): served apart."""
    return bool(lease.exclude) or lease.prefer is not None


def _unindex(index: dict[Any, list[Lease]], key: Any, lease: Lease) -> None:
    members = index[key]
    members.remove(lease)
    if not members:
        del index[key]


class Lease:
    """One slot on one server, from `async with` to its end; cancellation cannot leak it. While no slot is free
    it waits in the pool's queue."""

    __slots__ = (
        "exclude",
        "expected",
        "granted",
        "home",
        "keep",
        "links",
        "pool",
        "prefer",
        "queued",
        "queued_at",
        "seq",
        "server",
        "size",
        "started",
        "trial",
    )

    def __init__(
        self,
        pool: Slots,
        exclude: frozenset[str],
        prefer: str | None = None,
        size: float = 0.0,
        home: bool = False,
        keep: bool = False,
    ) -> None:
        self.pool = pool
        self.exclude = exclude
        self.prefer, self.home, self.keep = prefer, home, keep  # ServerPool.pick, ServerPool.unhome
        self.size = size
        self.server: ServerState | None = None
        self.started: float | None = None  # the pool's clock when the slot was taken
        self.trial = False
        self.granted: asyncio.Future[ServerState] | None = None  # set while queued for a slot
        self.links: tuple[Link, ...] = ()  # its prompt's prefixes (affinity.chain)
        self.expected = 0  # characters of them its server's cache was expected to hold (PrefixModel.match)
        self.queued_at = 0.0  # the pool's clock when it began to wait for a slot
        self.queued = False  # on the queue now
        self.seq = 0  # its place in the order leases queued (WaitQueue._widest_group's ties)

    async def __aenter__(self) -> ServerState:
        return await self.pool.acquire(self)

    async def __aexit__(self, *exc: object) -> None:
        if self.server is not None:
            self.pool.release(self, self.server, keep=self.keep and exc[0] is None)
