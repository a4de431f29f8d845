"""Pacing arithmetic as small pure functions: the queue margin per server and the tail rule."""

from __future__ import annotations

import math

# Requests kept queued on a server beyond its running slots, so that a finished one is replaced without a
# round trip: this share of its capacity, at least MIN_QUEUE_MARGIN (bench/balance.py measures it).
QUEUE_MARGIN_FRACTION = 0.125
MIN_QUEUE_MARGIN = 2
# Near the end, a server gets a new request only if it would finish it within this factor of the time
# the rest of the fleet needs for everything still waiting (their latencies include the wait in the
# servers' queues, so that time is already a little long).
TAIL_SLACK = 1.0


def queue_margin(capacity: int) -> int:
    """Requests to keep queued on a server that runs `capacity` at once."""
    return max(MIN_QUEUE_MARGIN, math.ceil(capacity * QUEUE_MARGIN_FRACTION))


def drain_seconds(waiting: int, queued: int, rate: float, last_s: float) -> float:
    """How long servers completing `rate` requests/s need for `waiting` more behind `queued` ones, and at
    least `last_s` (the request in hand, sent to them); the longest go first, so the last are short."""
    return max((waiting + queued) / rate, last_s)


def too_late(request_s: float, drain_s: float) -> bool:
    """Whether a request that takes `request_s` on this server would finish well after the rest of the fleet
    drains (a long request on a slow server at the end is the tail; kept for the others, it costs them a
    fraction of a second; a short one fits on the slow server)."""
    return request_s > TAIL_SLACK * drain_s
