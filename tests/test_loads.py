"""Capacity from the servers' own load reports: the simulator's KV-pool admission, the adjustment rule, and runs
whose start-up capacity the pool does not admit."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gen_pipeline.sim import SimConfig, free_ports, start_fleet

# sglang-cpu.md: 2048 slots, a pool of 8192 tokens, 16 requests of max_tokens 1000 ran 8 at a time
REAL = {"max_running": 2048, "max_total_tokens": 8192, "context_length": 2048, "health_delay": 0.0}


async def _chat(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int) -> int:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": max_tokens}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def _loads(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/v1/loads") as resp:
        body = await resp.json()
        return dict(body["loads"][0])


def _burst(kv_admission: bool, n: int = 16, max_tokens: int = 1000) -> tuple[int, dict[str, Any], list[int]]:
    """Send `n` requests at once to one port; its most running at once, a load report mid-burst, the statuses."""

    async def scenario() -> tuple[int, dict[str, Any], list[int]]:
        cfg = SimConfig(ports=tuple(free_ports(1)), token_latency=0.01, kv_admission=kv_admission, **REAL)
        async with await start_fleet(cfg) as fleet, aiohttp.ClientSession() as session:
            url = fleet.urls[0]
            sent = [asyncio.create_task(_chat(session, url, i, max_tokens)) for i in range(n)]
            for _ in range(2000):  # until every request has arrived (each runs for 0.1-0.5 s)
                if fleet.stats[cfg.ports[0]].in_flight == n:
                    break
                await asyncio.sleep(0.005)
            load = await _loads(session, url)
            statuses = await asyncio.gather(*sent)
            return fleet.stats[cfg.ports[0]].max_running, load, list(statuses)

    return asyncio.run(asyncio.wait_for(scenario(), 30))


def test_kv_admission_runs_what_the_pool_holds_and_queues_the_rest() -> None:
    """With kv_admission, 16 requests of max_tokens 1000 in a pool of 8192 run 8 at a time, the other 8 wait
    (num_waiting_reqs), as on SGLang 0.5.23; token_usage reports the reservations; all are answered."""
    most, load, statuses = _burst(kv_admission=True)
    assert statuses == [200] * 16
    assert most == 8
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (8, 8)
    assert load["num_total_tokens"] == 8192 and 8 * 1000 < load["num_used_tokens"] <= 8192
    assert load["token_usage"] == pytest.approx(load["num_used_tokens"] / 8192, abs=1e-4)


def test_without_kv_admission_only_the_slots_bound_concurrency() -> None:
    """Off (the default), the same burst runs all at once, as the simulator always did."""
    most, load, statuses = _burst(kv_admission=False)
    assert statuses == [200] * 16 and most == 16
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (16, 0)
