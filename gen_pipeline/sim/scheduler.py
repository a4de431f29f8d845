"""One port's counters and its scheduler: max_running slots, an optionally bounded queue, and (kv_admission) the
KV token pool SGLang admits by."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
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
    queued: int = 0  # requests waiting for a slot (and, with kv_admission, for room in the KV pool)
    reserved_tokens: int = 0  # KV pool tokens the running requests reserve (prompt + clipped max_tokens each)
    max_prompt_tokens: int = 0  # the largest prompt count (the server's) among accepted requests
    prefills: int = 0  # chat prompts computed, not served from the prefix cache
    prompt_tokens: int = 0  # chat prompt tokens of the requests run (usage.prompt_tokens, counted once for n)
    cached_tokens: int = 0  # of them, found in the prefix cache
    prefill_tokens: int = 0  # of them, prefilled: the GPU work paid (prompt_tokens - cached_tokens)
    crashes: int = 0
    restarts: int = 0
    output_tokens: int = 0  # completion tokens decoded (the 200 replies' usage.completion_tokens)
    decoded_tokens: int = 0  # every token decoded, those of requests stopped before their end included
    loop_tokens: int = 0  # of them, decoded in a loop (the loop fault): the waste a loop guard saves
    stopped: int = 0  # requests stopped before their end: their client left, or /abort_request
    aborts: int = 0  # /abort_request calls received
    busy_s: float = 0.0  # slot-seconds spent decoding: busy_s / elapsed is the mean number of running requests
    model_s: float = 0.0  # what the latency model asked of those slot-seconds (busy_s is longer on a busy machine)
    first_request_at: float | None = None  # time.time() of the first generation request
    last_reply_at: float | None = None  # time.time() when the last generation request was answered
    # Slot occupancy over time, for the benchmark's loss breakdown (ramp-up, steady state, drain):
    slot_area_s: float = 0.0  # the integral of `running` over time (slot-seconds held, replies included)
    first_full_at: float | None = None  # time.time() when all max_running slots were first held
    last_full_at: float | None = None  # time.time() when they were last all held
    area_at_first_full: float = 0.0  # slot_area_s at first_full_at
    area_at_last_full: float = 0.0  # slot_area_s at last_full_at
    area_at: float = 0.0  # time.time() up to which slot_area_s is summed


class Scheduler:
    """SGLang's admission on one port: run max_running, queue the rest, 503 past max_queued. With kv_admission a
    request also needs room for its reservation in the KV pool (KvPool), as SGLang's scheduler admits."""

    def __init__(self, cfg: SimConfig, stats: PortStats, slowness: float) -> None:
        self.cfg, self.stats, self.slowness = cfg, stats, slowness
        self.slots = asyncio.Semaphore(cfg.max_running)
        self.pool = KvPool(cfg.max_running, cfg.max_total_num_tokens) if cfg.kv_admission else None
        self.prefilling = asyncio.Lock()  # with a radix cache, one prefill at a time (server._cached_chat)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count a generation request as in flight while it is handled."""
        stats = self.stats
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        if stats.first_request_at is None:
            stats.first_request_at = time.time()
        try:
            yield
        finally:
            stats.in_flight -= 1
            stats.last_reply_at = time.time()

    @contextlib.asynccontextmanager
    async def slot(self, reserve: int = 0) -> AsyncIterator[None]:
        """Hold a running slot (and `reserve` tokens of the KV pool); wait in the queue for one, or raise 503
        when the queue is full."""
        stats, limit = self.stats, self.cfg.max_queued
        must_wait = stats.running >= self.cfg.max_running or stats.queued > 0
        if must_wait and limit is not None and stats.queued + 1 > limit:
            raise sglang.queue_full()
        stats.queued += 1
        try:
            await (self.slots.acquire() if self.pool is None else self.pool.acquire(reserve))
        finally:
            stats.queued -= 1
        self._occupancy(+1)
        stats.max_running = max(stats.max_running, stats.running)
        stats.reserved_tokens += reserve
        try:
            yield
        finally:
            stats.reserved_tokens -= reserve
            self._occupancy(-1)
            if self.pool is None:
                self.slots.release()
            else:
                self.pool.release(reserve)

    def _occupancy(self, step: int) -> None:
        """Change `running` by `step`, keeping the slot-occupancy counters."""
        stats, full = self.stats, self.cfg.max_running
        now = time.time()
        if stats.area_at:
            stats.slot_area_s += stats.running * (now - stats.area_at)
        stats.area_at = now
        if stats.running == full:  # leaving (or staying at) full occupancy
            stats.last_full_at, stats.area_at_last_full = now, stats.slot_area_s
        stats.running += step
        if stats.running == full and stats.first_full_at is None:
            stats.first_full_at, stats.area_at_first_full = now, stats.slot_area_s

    async def decode(
        self, tokens: int, prompt_tokens: int = 0, prefill: bool = True, produced: int | None = None, looped: int = 0
    ) -> None:
        """Spend the simulated prefill (unless the prefix cache held it) and decode time (call it holding a
        slot); `produced`: the output tokens made (n choices decode side by side: more than `tokens`), `looped`
        of them in a loop. A client that leaves meanwhile stops the decoding: what was decoded by then counts."""
        cfg = self.cfg
        prefill_s = (cfg.prefill_latency + prompt_tokens * cfg.prompt_token_latency) * prefill
        per_request = prefill_s + tokens * cfg.token_latency
        made = tokens if produced is None else produced
        started = time.monotonic()
        share = 1.0
        try:
            if per_request > 0:
                await asyncio.sleep(per_request * self.slowness)
        except asyncio.CancelledError:
            decode_s = tokens * cfg.token_latency * self.slowness
            spent = time.monotonic() - started - prefill_s * self.slowness
            share = min(1.0, max(0.0, spent / decode_s)) if decode_s > 0 else 0.0
            self.stats.stopped += 1
            raise
        finally:
            self.stats.busy_s += time.monotonic() - started
            self.stats.decoded_tokens += round(made * share)
            self.stats.loop_tokens += round(looped * share)
        self.stats.model_s += per_request * self.slowness
        self.stats.output_tokens += made


class KvPool:
    """SGLang's admission by its KV token pool: a request runs only when a running slot is free and its
    reservation fits beside the running ones' in `tokens`; first come, first served, so one that does not fit
    holds back the ones behind it (as SGLang's fcfs prefill adder stops at the first request that does not
    fit). Measured on 0.5.23: 2048 slots, a pool of 8192, 16 requests of max_tokens 1000 ran 8 at a time."""

    def __init__(self, slots: int, tokens: int) -> None:
        self.slots, self.tokens = slots, tokens
        self.running = 0
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, reserve: int) -> bool:
        # a request larger than the whole pool runs alone (SGLang's length checks refuse those beforehand)
        return self.running < self.slots and (self.used + reserve <= self.tokens or self.running == 0)

    async def acquire(self, reserve: int) -> None:
        """Wait until the request may run, then hold its slot and reservation."""
        if not self._waiting and self._fits(reserve):
            self._take(reserve)
            return
        entry = (reserve, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self.release(reserve)  # admitted just as it was cancelled: give the room back
            else:
                self._waiting.remove(entry)
                self._admit()  # it may have held back the ones behind it
            raise

    def release(self, reserve: int) -> None:
        """A request finished: free its slot and reservation, and admit what now fits."""
        self.running -= 1
        self.used -= reserve
        self._admit()

    def _take(self, reserve: int) -> None:
        self.running += 1
        self.used += reserve

    def _admit(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            reserve, future = self._waiting.popleft()
            self._take(reserve)
            future.set_result(None)
