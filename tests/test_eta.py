"""The ETA in status.json: every row not settled yet (in flight, queued, read ahead, unread) at the recent rate.

A run is replayed in virtual time: the real BatchReader reads a real file into the real RunStats (with an
injected clock), a bounded queue and a fleet of slots with latencies stand in for the runner, as it feeds
them (the queue holds two requests per slot; the reader reads the next batch once the last is queued).
"""

from __future__ import annotations

import heapq
from collections import deque
from pathlib import Path

import pytest
from conftest import FakeCounter
from e2e import prompts

from gen_pipeline.config import RunConfig
from gen_pipeline.engine.reader import BatchReader
from gen_pipeline.progress.stats import RunStats, snapshot
from gen_pipeline.records import Prompt
from gen_pipeline.resume.settled import ResumeState

MONITOR_TICK = 2.0  # the runner writes status.json (and so asks for the ETA) every STATUS_INTERVAL seconds
POINTS = (0.25, 0.5, 0.75)


class Clock:
    """Virtual seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(
    path: Path, tmp: Path, slots: int, latency: float, batch: int = 256
) -> tuple[dict[float, tuple[float, float]], float]:
    """Run the input through `slots` requests at a time; the ETA seen at each of POINTS, and the end time."""
    clock = Clock()
    stats = RunStats(clock=clock)
    config = RunConfig(input=path, out=tmp, tokenize_batch=batch)
    reader = BatchReader(config, FakeCounter(), ResumeState(), stats)
    queue: deque[Prompt] = deque()
    pending: deque[Prompt] = deque()
    done_reading = False
    events: list[tuple[float, int, str]] = [(0.0, 0, "tick")]
    total = len(path.read_bytes().splitlines())
    seen: dict[float, tuple[float, float]] = {}
    seq, end = 0, 0.0
    while events:
        clock.now, _, kind = heapq.heappop(events)
        if kind == "done":
            stats.in_flight -= 1
            stats.completed += 1
            end = clock.now
        elif kind == "tick" and stats.completed < total:
            snapshot(stats, [], "running", clock.now)  # what the monitor does: eta() samples the rate
            heapq.heappush(events, (clock.now + MONITOR_TICK, seq := seq + 1, "tick"))
        while not done_reading and len(queue) < 2 * slots:  # the producer fills the queue
            if not pending:
                items, _ = reader.next_batch()
                done_reading = not items
                pending.extend(p for p in items if isinstance(p, Prompt))
                continue
            queue.append(pending.popleft())
            stats.read += 1
        while queue and stats.in_flight < slots:  # the workers take from it
            prompt = queue.popleft()
            stats.in_flight += 1
            stats.requests += 1
            spread = 1 + (prompt.line * 37 % 11) / 10  # 1.0-2.0 x latency, varying from row to row
            heapq.heappush(events, (clock.now + latency * spread, seq := seq + 1, "done"))
        for point in POINTS:
            if point not in seen and stats.completed >= point * total:
                eta = stats.eta()
                assert eta is not None
                seen[point] = (clock.now, eta)
    return seen, end


@pytest.mark.parametrize(
    ("rows", "slots", "latency"),
    [
        (2000, 128, 1.0),  # the reader runs 640 rows ahead (slots, a queue of two per slot, a batch)
        (5000, 512, 0.5),  # 1,792 rows ahead: a third of the input is read at the start
        (6000, 64, 8.0),  # a run longer than the rate's window (the window, not the start, sets the rate)
    ],
)
def test_eta_is_within_30_percent_of_the_time_left(write_jsonl, tmp_path, rows, slots, latency):
    """At 25, 50 and 75% of a run, the ETA is within 30% of the time actually left."""
    seen, end = replay(write_jsonl(prompts(rows)), tmp_path, slots, latency)
    for point, (at, eta) in seen.items():
        left = end - at
        assert abs(eta - left) <= 0.3 * left, f"at {point:.0%}: ETA {eta:.1f} s, {left:.1f} s actually left"


def test_queued_counts_rows_read_but_not_sent(write_jsonl, tmp_path):
    """status.json's queued: what the reader handed over, less what is settled or in flight."""
    stats = RunStats(clock=Clock())
    reader = BatchReader(RunConfig(input=write_jsonl(prompts(300)), out=tmp_path), FakeCounter(), ResumeState(), stats)
    reader.next_batch()
    stats.in_flight, stats.completed = 50, 6
    assert stats.handed_over == 256 and stats.queued() == 200
    assert snapshot(stats, [], "running", 0.0)["counts"]["queued"] == 200


def test_eta_is_unknown_until_rows_settle(tmp_path):
    """No rate yet, or nothing read yet: no ETA rather than a made-up one."""
    clock = Clock()
    stats = RunStats(clock=clock)
    clock.now = 10.0
    assert stats.eta() is None
    stats.note_input(100, 0.5)
    assert stats.eta() is None
    stats.completed = 10
    assert stats.eta() == pytest.approx((200 - 10) / (10 / 10.0))


def test_status_json_says_when_a_row_was_last_settled(tmp_path):
    """last_settled: the snapshot's time less the seconds since the settled count last grew (the start
    before any row), so `status` can tell a stalled run from one still settling rows."""
    clock = Clock()
    stats = RunStats(clock=clock)
    clock.now = 30.0
    assert stats.idle() == 30.0  # nothing settled since the start
    stats.completed = 5
    clock.now = 40.0
    assert stats.idle() == 0.0  # seen growing now
    clock.now = 170.0  # an outage: nothing settles
    doc = snapshot(stats, [], "running", clock.now)
    assert doc["updated"] - doc["last_settled"] == pytest.approx(130.0, abs=0.2)
