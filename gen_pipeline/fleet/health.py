"""Whether a server is worth its failures, as small pure decisions (the probes of a server that is out
are in prober.py).

A failure's cost is what it took from the fleet. One that comes back at once and holds no slot (a 502 or
503 on arrival, a 429) is cheap: the request goes elsewhere and the server's slots kept doing useful work.
A timeout, a hang, or a 5xx or reset after seconds of work is expensive: a slot was held for nothing. A
refused connection means nothing listens. So a server stays in use while the slot-seconds it spends on
successes outweigh what its failures waste (`worth_keeping`), leaves at once when it refuses connections,
and after a few expensive failures in a row; a cheap failure never lengthens its lock-out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import ConnectError, OverloadedError, RequestError, RequestTimeout, RetryableError

# A failure answered within CHEAP_HELD_S, or within CHEAP_FRACTION of the server's mean latency, held no slot.
CHEAP_HELD_S = 0.25
CHEAP_FRACTION = 0.1
# What a cheap failure costs besides its own time: a round trip and a retry elsewhere.
FAILURE_OVERHEAD_S = 0.05
# A server stays in use while successes take at least this share of its useful plus wasted slot-seconds ...
MIN_EFFICIENCY = 0.25
# ... judged once this many recent outcomes (decayed) are known, over a window halving every HALF_LIFE_S.
MIN_EVIDENCE = 5.0
HALF_LIFE_S = 20.0
# ... and once the window spans this many of the server's request latencies: before that its first
# requests' successes have not come back, and a few instant failures would look like all it did.
JUDGE_AFTER_LATENCIES = 2.0
# Expensive failures in a row, with no success between them, that take a server out.
EXPENSIVE_IN_A_ROW = 3
# The lock-out after a failed trial doubles from INITIAL_COOLDOWN up to MAX_COOLDOWN (cheap failures excepted).
INITIAL_COOLDOWN = 1.0
MAX_COOLDOWN = 30.0
# A server with requests in flight that answers nothing for STALL_FACTOR x its slowest success (and at least
# STALL_FLOOR_S) is hanging: it gets no new request until it answers again.
STALL_FACTOR = 3.0
STALL_FLOOR_S = 10.0


class Cost(enum.Enum):
    """What one failed request cost the fleet."""

    NONE = "none"  # the request's own fault (a 400): the server is fine
    CHEAP = "cheap"  # answered at once, held no slot
    EXPENSIVE = "expensive"  # held a slot for a long time: timeout, hang, 5xx or reset after work
    DEAD = "dead"  # nothing listens: connection refused


def failure_cost(error: RequestError, held_s: float | None, mean_latency: float | None) -> Cost:
    """How much a failed request cost, from its kind and how long it held the server."""
    if not isinstance(error, RetryableError):
        return Cost.NONE
    if isinstance(error, ConnectError):
        return Cost.DEAD
    if isinstance(error, RequestTimeout):
        return Cost.EXPENSIVE
    if isinstance(error, OverloadedError) or held_s is None:
        return Cost.CHEAP
    cheap_within = max(CHEAP_HELD_S, CHEAP_FRACTION * (mean_latency or 0.0))
    return Cost.CHEAP if held_s <= cheap_within else Cost.EXPENSIVE


def wasted_seconds(cost: Cost, held_s: float | None) -> float:
    """The slot-seconds a failure wasted, its overhead included."""
    held = held_s or 0.0
    return held + FAILURE_OVERHEAD_S if cost is Cost.CHEAP else held


def decay_factor(elapsed_s: float, half_life_s: float = HALF_LIFE_S) -> float:
    """How much of an old figure still counts after `elapsed_s`."""
    return float(0.5 ** (max(elapsed_s, 0.0) / half_life_s))


@dataclass
class Window:
    """A server's recent useful and wasted slot-seconds and outcome count, decaying with time."""

    useful_s: float = 0.0
    wasted_s: float = 0.0
    evidence: float = 0.0
    at: float = 0.0
    since: float | None = None  # the first outcome counted

    def young(self, now: float, latency: float, first_waves: int) -> bool:
        """Whether the window is too short to judge a server whose requests take `latency`: it spans less
        than JUDGE_AFTER_LATENCIES of them and holds at most `first_waves` outcomes (a server failing every
        request at once is judged after that many)."""
        recent = self.since is not None and now - self.since < JUDGE_AFTER_LATENCIES * latency
        return recent and self.evidence <= first_waves

    def add(self, now: float, useful_s: float = 0.0, wasted_s: float = 0.0) -> None:
        """Decay the window to `now`, then add one outcome."""
        if self.since is None:
            self.since = now
        keep = decay_factor(now - self.at)
        self.useful_s = self.useful_s * keep + useful_s
        self.wasted_s = self.wasted_s * keep + wasted_s
        self.evidence = self.evidence * keep + 1.0
        self.at = now


def efficiency(useful_s: float, wasted_s: float) -> float:
    """The share of a server's recent slot-seconds that produced completions."""
    total = useful_s + wasted_s
    return useful_s / total if total > 0 else 1.0


def worth_keeping(window: Window) -> bool:
    """Whether a server's successes still outweigh what its failures waste (yes while evidence is thin)."""
    return window.evidence < MIN_EVIDENCE or efficiency(window.useful_s, window.wasted_s) >= MIN_EFFICIENCY


def should_take_out(cost: Cost, expensive_in_a_row: int, window: Window, trial: bool, young: bool = False) -> bool:
    """Whether a fresh failure (one sent after the breaker last opened) takes the server out; a `young`
    window (Window.young) is not judged on its efficiency yet."""
    if cost is Cost.NONE:
        return False
    if cost is Cost.DEAD or trial:
        return True
    return expensive_in_a_row >= EXPENSIVE_IN_A_ROW or (not young and not worth_keeping(window))


def next_cooldown(cooldown: float, cost: Cost) -> float:
    """The lock-out after the next one: doubled by an expensive failure, unchanged by a cheap one."""
    return cooldown if cost is Cost.CHEAP else min(cooldown * 2, MAX_COOLDOWN)


def stalled(in_flight: int, quiet_s: float, slowest_s: float | None) -> bool:
    """Whether a server with work in flight has been silent for far longer than its slowest success."""
    if in_flight == 0 or slowest_s is None:
        return False
    return quiet_s > max(STALL_FLOOR_S, STALL_FACTOR * slowest_s)
