"""Pacing arithmetic as tables: the queue margin and the tail rule."""

from __future__ import annotations

import pytest

from gen_pipeline.fleet import pacing


@pytest.mark.parametrize(("capacity", "margin"), [(1, 2), (3, 2), (16, 2), (17, 3), (64, 8), (256, 32)])
def test_queue_margin(capacity: int, margin: int) -> None:
    """An eighth of the running slots, at least two."""
    assert pacing.queue_margin(capacity) == margin


@pytest.mark.parametrize(
    ("slowest", "waiting", "late"),
    [
        (4.1, 0, False),  # an equal server at the very end: as fast as any other
        (16.4, 0, True),  # a 4x slower one at the very end
        (16.4, 600, True),  # 600 left for 96 slots of 2.3 s: they drain in 14.4 s
        (16.4, 700, False),  # 700 left: 16.8 s
    ],
)
def test_too_late(slowest: float, waiting: int, late: bool) -> None:
    """A server is skipped at the end only when the rest would drain everything well before it finished."""
    drain = pacing.drain_seconds(waiting, 0, rate=96 / 2.3, last_s=4.1)
    assert pacing.too_late(slowest, drain) is late
