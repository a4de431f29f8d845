"""Pacing arithmetic: the queue margin per server, a server's recent speed, and the tail rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Requests kept queued on a server beyond its running slots, so that a finished one is replaced without a
# round trip: this share of its capacity, at least MIN_QUEUE_MARGIN (bench/balance.py measures it).
QUEUE_MARGIN_FRACTION = 0.125
MIN_QUEUE_MARGIN = 2
# Near the end, a server gets a new request only if it would finish it within this factor of the time
# the rest of the fleet needs for everything still waiting (their latencies include the wait in the
# servers' queues, so that time is already a little long).
TAIL_SLACK = 1.0
# A server whose prefix cache likely holds the prompt is spared that much more: elsewhere the request would pay
# the prefill of that prefix again (and spread it), which the time measured on the servers does not show.
HOLDER_SLACK = 2.0
SPEED_WEIGHT = 0.2  # the weight of each new success in a server's seconds per output token
# A speed not measured for this many times the request it predicts is forgotten: a server left idle by
# the tail rule is judged again on its next answer, not forever on a slow spell it had earlier.
STALE_FACTOR = 3.0


@dataclass
class Speed:
    """A server's seconds per output token over its recent successes, and when it was last measured."""

    per_token: float | None = None
    at: float = -math.inf

    def request_s(self, size: float, now: float, latency: float) -> float | None:
        """Seconds a request of `size` output tokens should take (size or speed unknown: `latency`, a whole
        request's); None once forgotten."""
        estimate = size * self.per_token if self.per_token is not None and size > 0 else latency
        measured = self.at > -math.inf  # a speed never measured (set by hand) is not forgotten
        forgotten = measured and estimate > 0 and now - self.at > STALE_FACTOR * estimate
        return None if forgotten else estimate

    def add(self, latency: float, tokens: int, now: float) -> None:
        """One success of `tokens` output tokens in `latency` s; after a long silence it starts anew."""
        if tokens <= 0:
            return
        sample = latency / tokens
        if self.per_token is None or now - self.at > STALE_FACTOR * latency:
            self.per_token = sample
        else:
            self.per_token += SPEED_WEIGHT * (sample - self.per_token)
        self.at = now


def queue_margin(capacity: int) -> int:
    """Requests to keep queued on a server that runs `capacity` at once."""
    return max(MIN_QUEUE_MARGIN, math.ceil(capacity * QUEUE_MARGIN_FRACTION))


def drain_seconds(waiting: int, queued: int, rate: float, last_s: float) -> float:
    """How long servers completing `rate` requests/s need for `waiting` more behind `queued` ones, and at
    least `last_s` (the request in hand, sent to them); the longest go first, so the last are short."""
    return max((waiting + queued) / rate, last_s)


def too_late(request_s: float, drain_s: float, slack: float = TAIL_SLACK) -> bool:
    """Whether a request that takes `request_s` on this server would finish well after the rest of the fleet
    drains (a long request on a slow server at the end is the tail; kept for the others, it costs them a
    fraction of a second; a short one fits on the slow server)."""
    return request_s > slack * drain_s
