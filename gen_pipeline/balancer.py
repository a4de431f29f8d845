"""Choosing a server for each request: least loaded relative to capacity, healthy, not the one that
just failed. All per-server bookkeeping happens in `ServerPool.lease`, so cancellation cannot leak a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .errors import ConnectError, RequestError, RetryableError

# A server is taken out of rotation after this many transport failures in a row ...
FAILURE_THRESHOLD = 3
# ... for a cooldown that starts here and doubles on every failed trial, up to the maximum.
INITIAL_COOLDOWN = 1.0
MAX_COOLDOWN = 30.0


@dataclass
class ServerState:
    """One server: its capacity, what it is doing now and what it has done."""

    url: str
    capacity: int
    in_flight: int = 0
    requests: int = 0
    completions: int = 0
    output_tokens: int = 0
    latency_total: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    consecutive_failures: int = 0
    cooldown: float = INITIAL_COOLDOWN
    down_until: float = 0.0
    down_since: float | None = None
    out_reason: str = ""  # the ledger reason of the failure that took the server out
    out_of_service_s: float = 0.0
    trial: bool = False  # half-open: after a cooldown, one request at a time until one succeeds

    def available(self, now: float) -> bool:
        """Whether this server may take one more request now."""
        if now < self.down_until:
            return False
        limit = 1 if self.trial else self.capacity
        return self.in_flight < limit

    @property
    def load(self) -> float:
        return self.in_flight / self.capacity

    def view(self) -> dict[str, object]:
        """The per-server figures for the summary."""
        done = self.completions
        busy = self.latency_total
        return {
            "requests": self.requests,
            "completions": done,
            "failures": dict(self.failures),
            "mean_latency_s": round(self.latency_total / done, 3) if done else None,
            "output_tokens": self.output_tokens,
            # tokens per second of request time: the server's speed as this client saw it
            "output_tokens_per_request_s": round(self.output_tokens / busy, 1) if busy else None,
            "out_of_service_s": round(self.out_of_service_s, 1),
            "capacity": self.capacity,
        }


class ServerPool:
    """The fleet as the dispatcher sees it."""

    def __init__(self, servers: Iterable[ServerState], clock: Callable[[], float] = time.monotonic) -> None:
        self.servers = list(servers)
        self.clock = clock
        self._changed = asyncio.Condition()
        self._waiters = 0  # leases waiting for a slot: a release wakes them only when there are any
        self.waiting_since: float | None = None

    def pick(self, exclude: frozenset[str] = frozenset(), prefer: str | None = None) -> ServerState | None:
        """The least loaded available server (ties: fewest requests, then list order), avoiding
        `exclude` while any other server is healthy; `prefer` when it is available (the server that
        already holds this prompt in its prefix cache)."""
        now = self.clock()
        # Wait for a busy healthy server rather than go back to one that just failed.
        avoid = exclude if exclude and any(s.url not in exclude and now >= s.down_until for s in self.servers) else ()
        best: ServerState | None = None
        best_key = (0.0, 0)
        for s in self.servers:
            if s.url in avoid or not s.available(now):
                continue
            if s.url == prefer:
                return s
            key = (s.load, s.requests)
            if best is None or key < best_key:
                best, best_key = s, key
        return best

    def healthy(self) -> list[ServerState]:
        """Servers not cooling down."""
        now = self.clock()
        return [s for s in self.servers if now >= s.down_until]

    def outage_seconds(self) -> float:
        """How long no server at all has been usable (0 when one is)."""
        if self.healthy() or self.waiting_since is None:
            return 0.0
        return self.clock() - self.waiting_since

    async def _wait_for_server(self, exclude: frozenset[str], prefer: str | None = None) -> ServerState:
        # No await between the pick and taking the slot: no other task can take it in between.
        server = self.pick(exclude, prefer) or await self._wait(exclude)
        self.waiting_since = None
        server.in_flight += 1
        server.requests += 1
        return server

    async def _wait(self, exclude: frozenset[str]) -> ServerState:
        self._waiters += 1
        try:
            async with self._changed:
                while (server := self.pick(exclude)) is None:
                    if not self.healthy() and self.waiting_since is None:
                        self.waiting_since = self.clock()
                    wake = min((s.down_until for s in self.servers), default=0) - self.clock()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), max(0.05, min(wake, 1.0)))
                return server
        finally:
            self._waiters -= 1

    def lease(self, exclude: frozenset[str] = frozenset(), prefer: str | None = None) -> Lease:
        """Hold one slot on the best server for the duration of one request: `async with pool.lease()`."""
        return Lease(self, exclude, prefer)

    async def _release(self, server: ServerState) -> None:
        server.in_flight -= 1
        if self._waiters:
            async with self._changed:
                self._changed.notify()

    def record_success(self, server: ServerState, latency: float, output_tokens: int) -> None:
        """A completed request: the server is healthy."""
        server.completions += 1
        server.latency_total += latency
        server.output_tokens += output_tokens
        server.consecutive_failures = 0
        server.cooldown = INITIAL_COOLDOWN
        self._restore(server)

    def record_failure(self, server: ServerState, error: RequestError) -> None:
        """A failed request; transport failures in a row take the server out for a while."""
        server.failures[error.reason] += 1
        if not isinstance(error, RetryableError):
            self._restore(server)  # the server answered sensibly; the request was at fault
            return
        server.consecutive_failures += 1
        refused = isinstance(error, ConnectError)
        if server.trial or refused or server.consecutive_failures >= FAILURE_THRESHOLD:
            self._take_out(server, error.reason)

    def mark_down(self, server: ServerState) -> None:
        """Take a server out of rotation now (found dead at discovery)."""
        self._take_out(server, "connection")

    def out_of_service(self) -> list[ServerState]:
        """Servers taken out and not yet back: the ones the health prober watches."""
        return [s for s in self.servers if s.down_since is not None]

    def record_probe(self, server: ServerState, ok: bool, interval: float) -> None:
        """An active health probe's answer for a server that is out of service.

        A server that was unreachable comes back as soon as it answers (for one trial request);
        one that answered with errors still waits out its cooldown. A failed probe keeps it out.
        """
        now = self.clock()
        if not ok:
            server.down_until = max(server.down_until, now + 2 * interval)
        elif server.out_reason in ("connection", "timeout"):
            server.down_until = min(server.down_until, now)

    def _take_out(self, server: ServerState, reason: str) -> None:
        now = self.clock()
        if server.down_since is None:
            server.down_since = now
        server.out_reason = reason
        server.down_until = now + server.cooldown
        server.cooldown = min(server.cooldown * 2, MAX_COOLDOWN)
        server.trial = True

    def _restore(self, server: ServerState) -> None:
        if server.down_since is not None:
            server.out_of_service_s += self.clock() - server.down_since
            server.down_since = None
        server.trial = False


class Lease:
    """One slot on one server, from `async with` to its end; cancellation cannot leak it."""

    __slots__ = ("exclude", "pool", "prefer", "server")

    def __init__(self, pool: ServerPool, exclude: frozenset[str], prefer: str | None = None) -> None:
        self.pool = pool
        self.exclude = exclude
        self.prefer = prefer
        self.server: ServerState | None = None

    async def __aenter__(self) -> ServerState:
        self.server = await self.pool._wait_for_server(self.exclude, self.prefer)
        return self.server

    async def __aexit__(self, *exc: object) -> None:
        if self.server is not None:
            await self.pool._release(self.server)
