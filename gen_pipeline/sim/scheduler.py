"""One port's counters and its scheduler: max_running slots, an optionally bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from . import sglang
from .config import SimConfig


@dataclass
class PortStats:
    """Counters of one port, read by tests and printed when the simulator stops."""

    requests: int = 0  # generation requests received (chat + completions)
    completions: int = 0  # 200 replies carrying a completion
    errors: int = 0  # error replies sent (4xx and 5xx, injected ones included)
    length_errors: int = 0  # 400s from the length checks A-D
    dropped: int = 0  # requests whose connection was closed with no reply (p-drop, crash)
    hung: int = 0  # requests left unanswered on purpose (p-hang)
    in_flight: int = 0  # generation requests being handled now, queued or running
    max_in_flight: int = 0
    running: int = 0  # requests holding one of the max_running slots
    max_running: int = 0
    queued: int = 0  # requests waiting for a slot
    max_prompt_tokens: int = 0  # the largest prompt count (the server's) among accepted requests
    prefills: int = 0  # chat prompts computed, not served from the prefix cache
    crashes: int = 0
    restarts: int = 0


class Scheduler:
    """SGLang's admission on one port: run max_running, queue the rest, 503 past max_queued."""

    def __init__(self, cfg: SimConfig, stats: PortStats, slowness: float) -> None:
        self.cfg, self.stats, self.slowness = cfg, stats, slowness
        self.slots = asyncio.Semaphore(cfg.max_running)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count a generation request as in flight while it is handled."""
        stats = self.stats
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            yield
        finally:
            stats.in_flight -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a running slot; wait in the queue for one, or raise 503 when the queue is full."""
        stats, limit = self.stats, self.cfg.max_queued
        must_wait = stats.running >= self.cfg.max_running or stats.queued > 0
        if must_wait and limit is not None and stats.queued + 1 > limit:
            raise sglang.queue_full()
        stats.queued += 1
        try:
            await self.slots.acquire()
        finally:
            stats.queued -= 1
        stats.running += 1
        stats.max_running = max(stats.max_running, stats.running)
        try:
            yield
        finally:
            stats.running -= 1
            self.slots.release()

    async def decode(self, tokens: int, prefill: bool = True) -> None:
        """Spend the simulated prefill (unless the prefix cache held it) and decode time (call it holding a slot)."""
        per_request = self.cfg.prefill_latency * prefill + tokens * self.cfg.token_latency
        if per_request > 0:
            await asyncio.sleep(per_request * self.slowness)
