"""Choosing a server for each request: the earliest expected completion among healthy servers, never the one
that just failed, and every server kept full, with a small queue beyond its running slots. All per-server
bookkeeping happens in `ServerPool.lease`, so cancellation cannot leak a slot. Health decisions are in health.py,
one server's state in state.py, the leases waiting for a slot (and which of them a free slot goes to) in
waitqueue.py.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection, Iterable

from ..errors import ConnectError, OverloadedError, RequestError
from . import affinity, health, pacing
from .affinity import Link
from .health import Cost, Window
from .state import ServerState
from .waitqueue import Lease, WaitQueue

__all__ = ["ServerPool", "ServerState"]

# Extra workers per slot: prompts that wait out a retry's backoff do not leave a slot idle, and once the
# input is exhausted the longest of the prompts waiting for a slot goes first (bench/balance.py measures it).
SPARE_WORKERS = 1.0
LATENCY_WEIGHT = 0.05  # the weight of each new success in a server's mean latency
POLL_S = 0.25  # how often a waiting lease looks again without being woken


class ServerPool:
    """The fleet as the dispatcher sees it."""

    def __init__(self, servers: Iterable[ServerState], clock: Callable[[], float] = time.monotonic) -> None:
        self.servers = list(servers)
        self.clock = clock
        self.queue = WaitQueue(self)  # leases waiting for a slot; the pool hands slots to them
        self._poller: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None  # the next look
        self.waiting_since: float | None = None
        self._backlog: Callable[[], int] | None = None  # begin_tail
        self.last_dispatch: float | None = None
        self.last_completion: float | None = None

    def begin_tail(self, backlog: Callable[[], int]) -> None:
        """The input is exhausted: `backlog()` counts the requests still to send (read, not yet dispatched), and
        from now on no request queues beyond a server's running slots and the tail rule judges each choice."""
        self._backlog = backlog

    @property
    def in_tail(self) -> bool:
        """Whether the input is exhausted (begin_tail): slow servers may be left idle on purpose."""
        return self._backlog is not None

    def worker_count(self) -> int:
        """Requests the pipeline should keep going at once: every slot and queue margin, plus spares; where the
        load watcher may raise a server's capacity, as many as its ceiling takes (ServerState.most)."""
        slots = sum(s.most() for s in self.servers)
        return slots + math.ceil(slots * SPARE_WORKERS)

    def serving_slots(self) -> int:
        """The same over the servers in service now (a dead server's guessed capacity runs nothing)."""
        now = self.clock()
        return sum(s.limit for s in self.servers if now >= s.down_until)

    def pick(
        self,
        exclude: frozenset[str] = frozenset(),
        waiting: bool = False,
        prefer: str | None = None,
        size: float = 0,
        home: bool = False,
        links: tuple[Link, ...] = (),
        patient: bool = False,
    ) -> ServerState | None:
        """The available server with a free running slot that would finish a request first (then the one with
        the shortest queue; ties: least loaded, fewest requests), avoiding `exclude` while any other server is
        healthy and, near the end, servers far slower than the rest of the fleet. `prefer` (the server whose
        prefix cache holds this prompt) alone while it is in service: a lease waits for a slot there. With
        `home` (a conversation's next turn: `prefer` answered the last and kept room for this one, its home)
        `prefer` while it is in service and has room counting that home, else another server (a prefill).
        `links` (affinity.chain): the server likely to hold the longest prefix, while it has room (affinity.steer:
        a `patient` lease waits for it when it is busy and others are free)."""
        now = self.clock()
        # Wait for a busy healthy server rather than go back to one that just failed.
        avoid = exclude if exclude and any(s.url not in exclude and now >= s.down_until for s in self.servers) else ()
        latency = self.latencies()
        # A free running slot first: a request queued behind others while a slot idles elsewhere wastes it.
        # Once the input is exhausted nothing more is queued: a request kept here takes the first slot to free.
        tail = self.in_tail
        candidates = sorted(
            (s.taken() >= s.capacity, s.expected_s(latency[s.url]), s.load, s.requests, i)
            for i, s in enumerate(self.servers)
            if s.url not in avoid and s.available(now) and not (tail and s.taken() >= s.capacity)
        )
        if (held := self._preferred(prefer, avoid, now)) is not None:  # its prefix cache holds the prompt
            if home:
                # a next turn uses the room kept for it: in the tail it waits only while the capacity runs (kept
                # room can fill the queue margin too, and counting it there refused every lease: a hang)
                if held.available(now, own_home=True) and not (tail and held.in_flight >= held.capacity):
                    return held
            else:
                return held if any(self.servers[i] is held for *_, i in candidates) else None  # else wait for it
        late = self._tail_judge(latency, now, waiting, size) if tail and candidates else None
        if links:
            serving = [s for s in self.servers if s.url not in avoid and now >= s.down_until]
            near, wait = affinity.steer([self.servers[i] for *_, i in candidates], serving, links, patient)
            if wait:
                return None
            if near is not None and not (late is not None and late(near, pacing.HOLDER_SLACK)):
                return near
        for *_, i in candidates:
            server = self.servers[i]
            if late is None or not late(server, pacing.TAIL_SLACK):
                return server
        return None

    def _preferred(self, prefer: str | None, avoid: Collection[str], now: float) -> ServerState | None:
        """The server a lease prefers, while it is in service and not to be avoided (None: no preference)."""
        if prefer is None:
            return None
        for s in self.servers:
            if s.url == prefer and s.url not in avoid and now >= s.down_until:
                return s
        return None

    def latencies(self) -> dict[str, float]:
        """Each server's mean latency; the fleet's mean for servers with none yet (1 s before any)."""
        known = [s.mean_latency for s in self.servers if s.mean_latency is not None]
        default = sum(known) / len(known) if known else 1.0
        return {s.url: default if s.mean_latency is None else s.mean_latency for s in self.servers}

    def _too_late(
        self,
        server: ServerState,
        latency: dict[str, float],
        now: float,
        waiting: bool,
        size: float,
        slack: float = pacing.TAIL_SLACK,
    ) -> bool:
        """Whether the rest of the fleet would drain everything still waiting, this request last, well before
        (`slack` times) `server` could finish this request (of `size` output tokens). A server whose speed is not
        known (or forgotten after a long idle spell) gets the request: its answer measures it."""
        return self._tail_judge(latency, now, waiting, size)(server, slack)

    def _tail_judge(
        self, latency: dict[str, float], now: float, waiting: bool, size: float
    ) -> Callable[[ServerState, float], bool]:
        """`_too_late` for one request, the fleet's sums taken once (a pick asks it of several servers)."""
        assert self._backlog is not None
        serving = [s for s in self.servers if now >= s.down_until]
        rates = {s.url: s.capacity / latency[s.url] for s in serving}
        queued = {s.url: max(0, s.in_flight - s.capacity) for s in serving}
        times = {s.url: s.speed.request_s(size, now, latency[s.url]) or latency[s.url] for s in serving}
        all_rate, all_queued, all_times = sum(rates.values()), sum(queued.values()), sum(times.values())
        waiting_here = self._backlog() + len(self.queue) + (0 if waiting else 1)

        def too_late(server: ServerState, slack: float = pacing.TAIL_SLACK) -> bool:
            here = server.speed.request_s(size, now, latency[server.url])
            own = server.url in rates  # the others are the servers in service but this one
            others = len(serving) - own
            rate = all_rate - rates[server.url] if own else all_rate
            if here is None or others == 0 or rate <= 0:
                return False
            ahead = all_queued - queued[server.url] if own else all_queued
            last = (all_times - times[server.url] if own else all_times) / others
            return pacing.too_late(here, pacing.drain_seconds(waiting_here, ahead, rate, last), slack)

        return too_late

    def healthy(self) -> list[ServerState]:
        """Servers not taken out."""
        now = self.clock()
        return [s for s in self.servers if now >= s.down_until]

    def outage_seconds(self) -> float:
        """How long no server at all has been usable (0 when one is)."""
        if self.healthy() or self.waiting_since is None:
            return 0.0
        return self.clock() - self.waiting_since

    def tail_seconds(self) -> float | None:
        """From the last request sent to the last completion (None before any completion)."""
        if self.last_dispatch is None or self.last_completion is None:
            return None
        return max(0.0, self.last_completion - self.last_dispatch)

    def views(self) -> dict[str, dict[str, object]]:
        """Every server's figures for the summary."""
        now = self.clock()
        return {s.url: s.view(now) for s in self.servers}

    async def acquire(self, lease: Lease) -> ServerState:
        """The server `lease` takes a slot on, now or once one is handed to it."""
        # No await between the pick and taking the slot: no other task can take it in between. A lease
        # queues behind waiting ones rather than jump them (in the tail the longest of them goes first).
        if self.queue:
            return await self._wait(lease)
        server = self.pick(
            lease.exclude, prefer=lease.prefer, size=lease.size, home=lease.home, links=lease.links, patient=True
        )
        if server is None:
            return await self._wait(lease)
        self.take(lease, server)
        return server

    def take(self, lease: Lease, server: ServerState) -> None:
        """Give `lease` one slot on `server`."""
        self.waiting_since = None
        now = self.last_dispatch = lease.started = self.clock()
        if server.in_flight == 0:
            server.quiet_since = now
        server.in_flight += 1
        server.requests += 1
        server.last_sent = now
        if lease.home:  # its home's room is used, or left for another server
            lease.home = False
            self.unhome(lease.prefer, hand_out=False)
        lease.trial = server.trial
        server.trial_in_flight += lease.trial
        lease.server = server
        if lease.links:
            lease.expected = server.prefixes.match(lease.links)
            server.prefixes.note(lease.links)

    async def _wait(self, lease: Lease) -> ServerState:
        """Queue `lease` until the queue's hand-out gives it a slot; a slot given to a lease cancelled meanwhile is
        freed."""
        granted = self.queue.push(lease)
        try:
            self._poll()
            return await granted
        except BaseException:
            if lease.server is not None:  # cancelled after the slot was given
                self.release(lease, lease.server)
                lease.server = None
            raise
        finally:
            self.queue.remove(lease)

    def _poll(self) -> None:
        """Hand out what is free, and look again soon while leases wait (a lock-out may end meanwhile)."""
        self.queue.hand_out()
        if not self.queue:
            return
        if not self.healthy() and self.waiting_since is None:
            self.waiting_since = self.clock()
        now, loop = self.clock(), asyncio.get_running_loop()
        wake = min((s.down_until - now for s in self.servers if s.down_until > now), default=POLL_S)
        if self._poller is None or self._poller[0] is not loop:
            self._poller = (loop, loop.call_later(max(0.05, min(wake, POLL_S)), self._look_again))

    def _look_again(self) -> None:
        self._poller = None
        self._poll()

    def lease(
        self,
        exclude: frozenset[str] = frozenset(),
        prefer: str | None = None,
        size: float = 0.0,
        home: bool = False,
        keep: bool = False,
        links: tuple[Link, ...] = (),
    ) -> Lease:
        """Hold one slot on the best server for the duration of one request: `async with pool.lease()`.
        `size`: the request's expected work (its max_tokens), which orders waiting leases in the tail; `links`:
        its prompt's prefixes (affinity.chain), steering it to a server whose cache likely holds one."""
        lease = Lease(self, exclude, prefer, size, home, keep)
        lease.links = links
        return lease

    def unhome(self, url: str | None, hand_out: bool = True) -> None:
        """A conversation's next turn will not use the room its last turn's server kept for it."""
        for server in self.servers:
            if server.url == url and server.homes > 0:
                server.homes -= 1
                if hand_out:
                    self.queue.hand_out()

    def release(self, lease: Lease, server: ServerState, keep: bool = False) -> None:
        """Return a lease's slot and hand it on (`keep`: room stays for the conversation's next turn)."""
        server.in_flight -= 1
        server.homes += keep
        server.trial_in_flight -= lease.trial
        self.queue.hand_out()

    def record_success(
        self, server: ServerState, latency: float, output_tokens: int, started: float | None = None
    ) -> None:
        """A completed request: the server works, so any lock-out ends (a fresh one also ends the trial)."""
        now = self.last_completion = server.quiet_since = self.clock()
        server.completions += 1
        server.latency_total += latency
        server.output_tokens += output_tokens
        old = server.mean_latency
        server.mean_latency = latency if old is None else old + LATENCY_WEIGHT * (latency - old)
        server.slowest_s = max(server.slowest_s or 0.0, latency)
        server.speed.add(latency, output_tokens, now)
        server.window.add(now, useful_s=latency)
        server.expensive_in_a_row = 0
        self._end_lockout(server, now)
        if server.trial and not self._stale(server, started):
            server.trial = False
            server.cooldown = health.INITIAL_COOLDOWN
            server.window = Window(at=now, since=now)

    def record_failure(self, server: ServerState, error: RequestError, started: float | None = None) -> None:
        """A failed request: a fresh one may take the server out; one sent before the breaker opened cannot."""
        now = server.quiet_since = self.clock()
        server.failures[error.reason] += 1
        if isinstance(error, ConnectError):
            server.requests -= 1  # refused: the server never saw it
        if isinstance(error, OverloadedError) and error.status == 503:
            server.margin = 0  # its queue is bounded: keep no more than it runs
        held = None if started is None else now - started
        cost = health.failure_cost(error, held, server.mean_latency)
        if cost is Cost.NONE or self._stale(server, started):
            return
        self._judge(server, error.reason, cost, held, now)

    def record_contradicted(self, server: ServerState) -> None:
        """A row the server refused (400) was served by another: a failure of the server's, not the row's
        (already counted by reason), judged as an instant failure is."""
        self._judge(server, "bad_request", Cost.CHEAP, None, self.clock())

    def _judge(self, server: ServerState, reason: str, cost: Cost, held: float | None, now: float) -> None:
        """Add a failure's cost to the server's window; take it out when its health says so."""
        server.window.add(now, wasted_s=health.wasted_seconds(cost, held))
        server.expensive_in_a_row += cost is Cost.EXPENSIVE
        young = server.window.young(now, server.mean_latency or self.latencies()[server.url], 2 * server.limit)
        if health.should_take_out(cost, server.expensive_in_a_row, server.window, server.trial, young):
            self._take_out(server, reason, cost)

    def mark_down(self, server: ServerState) -> None:
        """Take a server out of rotation until a probe answers (found dead at discovery)."""
        self._take_out(server, "connection", Cost.DEAD)

    def retire(self, server: ServerState) -> None:
        """Take a server out for the rest of the run (its checkpoint changed): no probe or success readmits it."""
        self._take_out(server, "checkpoint_changed", Cost.DEAD)
        server.retired = True

    def all_retired(self) -> bool:
        """Whether every server of the pool has been retired."""
        return all(s.retired for s in self.servers)

    def out_of_service(self) -> list[ServerState]:
        """Servers taken out and not yet back: the ones the health prober watches (never a retired one)."""
        now = self.clock()
        return [s for s in self.servers if now < s.down_until and not s.retired]

    def record_probe(self, server: ServerState, ok: bool, interval: float) -> None:
        """An active health probe's answer for a server that is out of service.

        A server that was unreachable or hanging comes back as soon as it answers (for one trial request);
        one that answered with errors still waits out its cooldown. A failed probe keeps it out.
        """
        now = self.clock()
        if not ok:
            server.down_until = max(server.down_until, now + 2 * interval)
        elif server.out_reason in ("connection", "timeout"):
            server.down_until = min(server.down_until, now)

    def _stale(self, server: ServerState, started: float | None) -> bool:
        """Whether a request was sent before the server's breaker last opened."""
        return started is not None and started < server.opened_at

    def _take_out(self, server: ServerState, reason: str, cost: Cost) -> None:
        now = self.clock()
        self._end_lockout(server, now)
        if server.out_since is None:
            server.out_since = now
        server.opened_at = now
        server.out_reason = reason
        # Nothing listens: wait for a probe to answer rather than send it requests on a timer.
        server.down_until = math.inf if cost is Cost.DEAD else now + server.cooldown
        server.cooldown = health.next_cooldown(server.cooldown, cost)
        server.trial = True

    def _end_lockout(self, server: ServerState, now: float) -> None:
        """Close the out-of-service period (at its end, if it ended by itself) and lift the lock-out."""
        if server.retired:
            return
        if server.out_since is not None:
            server.out_of_service_s += max(0.0, min(now, server.down_until) - server.out_since)
            server.out_since = None
        server.down_until = min(server.down_until, now)
