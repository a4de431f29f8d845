"""One server as the balancer sees it: its capacity, what it is doing now, what it has done, and the figures
the summary reports for it. The decisions made from these are in balancer.py and health.py."""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field

from . import health, pacing
from .affinity import PrefixModel
from .health import Window
from .provenance import ServerIdentity


class LoadSource(enum.Enum):
    """Where a server reports the requests it runs and queues: the path it answers on."""

    SGLANG = "/v1/loads"  # JSON, per DP rank
    VLLM = "/metrics"  # Prometheus text


# The source each server kind has (discovery checks that a server answers it; the others are not watched).
LOAD_SOURCES = {"sglang": LoadSource.SGLANG, "vllm": LoadSource.VLLM}


@dataclass
class ServerState:
    """One server: its capacity, what it is doing now and what it has done."""

    url: str
    capacity: int
    margin: int = 0  # requests in flight beyond `capacity`, queued at the server
    # the margin is pacing.queue_margin(capacity), and stays so when the load watcher moves `capacity`: the
    # server's own queue kept non-empty but short (False: --queue-margin set it, or none at all)
    margin_follows: bool = False
    capacity_source: str = "default"  # where `capacity` came from (capacity.SOURCES)
    # the most the load watcher (loads.py) may raise `capacity` to; None: the server reports no load, or
    # --concurrency set it, and `capacity` stays what it was at start
    ceiling: int | None = None
    capacity_low: int = 0  # the least and the most `capacity` was during the run (0: what it was at start)
    capacity_high: int = 0
    in_flight: int = 0
    homes: int = 0  # conversations between two turns whose next turn this server keeps room for (--turns all)
    trial_in_flight: int = 0
    requests: int = 0  # requests the server received (refused connections are not counted)
    completions: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0  # as the server counted them (usage.prompt_tokens)
    cached_tokens: int | None = None  # of them, served by its prefix cache (None: the server reports none)
    latency_total: float = 0.0
    mean_latency: float | None = None
    slowest_s: float | None = None
    speed: pacing.Speed = field(default_factory=pacing.Speed)
    failures: Counter[str] = field(default_factory=Counter)
    rejects: Counter[str] = field(default_factory=Counter)  # of its answers (completions), those rejected, by reason
    window: Window = field(default_factory=Window)
    expensive_in_a_row: int = 0
    cooldown: float = health.INITIAL_COOLDOWN
    down_until: float = -math.inf  # no new request before this (inf: until a probe answers)
    out_since: float | None = None  # when the current out-of-service period began
    opened_at: float = -math.inf  # when the breaker last opened: requests sent before it are stale
    out_reason: str = ""  # the ledger reason of the failure that took the server out
    out_of_service_s: float = 0.0  # closed out-of-service periods
    trial: bool = False  # half-open: one fresh request at a time until one succeeds
    quiet_since: float = 0.0  # the last answer, or when it got work after being idle
    identity: ServerIdentity | None = None  # the checkpoint it served at start (None: not known)
    retired: bool = False  # its checkpoint changed mid-run: out for the rest of the run
    last_sent: float = -math.inf  # when it was last given a request (progress/alerts.py: a server left idle)
    bad_usage: int = 0  # answers whose usage was impossible (send/usage.py), and the first one's reason
    bad_usage_first: str = ""
    prefixes: PrefixModel = field(default_factory=lambda: PrefixModel(None))  # what its prefix cache may hold
    loads: LoadSource | None = None  # where its load reports are read (fleet/loads.py; None: not watched)

    def set_capacity(self, capacity: int) -> None:
        """Change `capacity` (the load watcher's finding), keeping the range it moved through."""
        start = self.capacity
        self.capacity_low = min(self.capacity_low or start, capacity)
        self.capacity_high = max(self.capacity_high or start, capacity)
        self.capacity = capacity
        if self.margin_follows:
            self.margin = pacing.queue_margin(capacity)

    def most(self) -> int:
        """The most requests it may have in flight during the run: at its ceiling where the load watcher may
        raise its capacity (with the queue margin there), else its limit now."""
        top = max(self.capacity, self.ceiling or 0)
        return top + (pacing.queue_margin(top) if self.margin_follows else self.margin)

    def capacity_range(self) -> list[int]:
        """[least, most] capacity over the run (both the capacity when it never moved)."""
        return [self.capacity_low or self.capacity, self.capacity_high or self.capacity]

    @property
    def limit(self) -> int:
        return self.capacity + self.margin

    @property
    def load(self) -> float:
        return self.in_flight / self.capacity

    def taken(self, own_home: bool = False) -> int:
        """Its places in use: requests in flight, and the room kept for conversations' next turns (less the
        asker's own)."""
        return self.in_flight + self.homes - (own_home and self.homes > 0)

    def available(self, now: float, own_home: bool = False) -> bool:
        """Whether this server may take one more request now (`own_home`: one that has room kept here)."""
        if now < self.down_until or self.taken(own_home) >= self.limit or (self.trial and self.trial_in_flight >= 1):
            return False
        return not health.stalled(self.in_flight, now - self.quiet_since, self.slowest_s)  # the dearest last

    def expected_s(self, latency: float) -> float:
        """Seconds until one more request sent now would complete, behind the ones queued there."""
        queued_ahead = max(0, self.in_flight + 1 - self.capacity)
        return latency * (1 + queued_ahead / self.capacity)

    def note_usage(self, prompt_tokens: int | None, cached_tokens: int | None) -> None:
        """Add one answer's prompt tokens and the part of them the server's prefix cache served."""
        self.prompt_tokens += prompt_tokens or 0
        if cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + cached_tokens

    def out_of_service(self, now: float) -> float:
        """Seconds this server could not be sent new requests, the current period included."""
        if self.out_since is None:
            return self.out_of_service_s
        return self.out_of_service_s + max(0.0, min(now, self.down_until) - self.out_since)

    def view(self, now: float) -> dict[str, object]:
        """The per-server figures for the summary."""
        done = self.completions
        busy = self.latency_total
        return {
            "requests": self.requests,
            "completions": done - sum(self.rejects.values()),
            "failures": dict(self.failures),
            **({"rejected": dict(self.rejects)} if self.rejects else {}),  # answers the checks refused (resampled)
            "mean_latency_s": round(self.latency_total / done, 3) if done else None,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            # the prompt tokens its prefix cache did not hold: the prefill it paid (None: it reports no cache)
            "prefill_tokens": None if self.cached_tokens is None else self.prompt_tokens - self.cached_tokens,
            # tokens per second of request time: the server's speed as this client saw it
            "output_tokens_per_request_s": round(self.output_tokens / busy, 1) if busy else None,
            "out_of_service_s": round(self.out_of_service(now), 1),
            "capacity": self.capacity,
            "capacity_source": self.capacity_source,
            "queue_margin": self.margin,
            # the least and the most its load reports moved it to (loads.py); only on the servers watched
            **({"capacity_range": self.capacity_range()} if self.ceiling is not None else {}),
            **({"impossible_usage": self.bad_usage} if self.bad_usage else {}),
            **({"retired": "its checkpoint is not the run's"} if self.retired else {}),
        }
