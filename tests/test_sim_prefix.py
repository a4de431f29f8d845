"""The simulator's radix prefix cache, counted in tokens: what is held, what is evicted, what a request pays."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from e2e import run_sim

from gen_pipeline.progress.stats import format_summary
from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.sim.radix import RadixCache

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 60}


def test_a_prompt_matches_its_longest_held_prefix():
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4, 5])
    assert cache.match([1, 2, 3, 9]) == 3
    assert cache.match([1, 2, 3, 4, 5, 6]) == 5
    assert cache.match([7]) == 0
    cache.insert([1, 2, 3, 8, 8])  # splits the edge after 3: both branches held, 3 shared ids once
    assert cache.tokens == 7
    assert cache.match([1, 2, 3, 8, 8, 8]) == 5 and cache.match([1, 2, 3, 4, 5]) == 5


def test_the_least_recently_used_leaf_goes_first_and_capacity_holds():
    cache = RadixCache(8)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.match([1, 2, 3, 4])  # used last: the other branch is the one evicted
    cache.insert([9, 9, 9, 9])
    assert cache.tokens <= 8
    assert cache.match([1, 2, 3, 4]) == 4 and cache.match([1, 2, 5, 6]) == 2 and cache.match([9, 9, 9, 9]) == 4


def test_a_parent_left_without_children_is_evicted_in_turn():
    cache = RadixCache(6)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])  # [1, 2] / [3] / [4]: 4 tokens
    cache.insert([7, 7, 7, 7, 7])  # 9 > 6: both old leaves go, then their parent [1, 2]
    assert cache.tokens == 5 and cache.match([1, 2]) == 0


def test_no_capacity_holds_nothing():
    cache = RadixCache(0)
    cache.insert([1, 2, 3])
    assert cache.tokens == 0 and cache.match([1, 2, 3]) == 0


async def _chat(session: aiohttp.ClientSession, url: str, messages: list[Any]) -> dict[str, Any]:
    body = {"model": "sim-model", "messages": messages, "max_tokens": 20}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        out: dict[str, Any] = await resp.json()
        return out


def _ask(cfg: SimConfig, conversations: list[list[Any]]) -> tuple[list[dict[str, Any]], Any]:
    """Send each conversation in turn to the fleet's first port; the bodies and that port's counters."""

    async def scenario() -> tuple[list[dict[str, Any]], Any]:
        async with await start_fleet(cfg) as fleet, aiohttp.ClientSession() as session:
            bodies = [await _chat(session, fleet.urls[0], c) for c in conversations]
            return bodies, fleet.stats[cfg.ports[0]]

    return asyncio.run(asyncio.wait_for(scenario(), 20))


def _sim(**fields: Any) -> SimConfig:
    return SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, **fields)


def test_a_shared_system_prompt_is_prefilled_once_and_reported_cached():
    first = [SYSTEM, {"role": "user", "content": "What is two and two?"}]
    second = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    plain, _ = _ask(_sim(), [first, second])
    bodies, stats = _ask(_sim(prefix_cache_tokens=10_000), [first, second])
    counts = [b["usage"]["prompt_tokens"] for b in bodies]
    assert counts == [b["usage"]["prompt_tokens"] for b in plain]  # the cache never changes the count
    held = bodies[1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert bodies[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert 0.9 * counts[1] < held < counts[1]  # the system prompt and the template up to the question
    assert stats.prompt_tokens == sum(counts) and stats.cached_tokens == held
    assert stats.prefill_tokens == sum(counts) - held


def test_a_conversations_next_turn_finds_the_answer_this_port_gave():
    turn1 = [{"role": "user", "content": "Tell me something about rivers and the sea."}]
    (answer,), _ = _ask(_sim(prefix_cache_tokens=10_000), [turn1])
    reply = {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
    turn2 = [*turn1, reply, {"role": "user", "content": "And lakes?"}]
    bodies, stats = _ask(_sim(prefix_cache_tokens=10_000), [turn1, turn2])
    first, second = (b["usage"]["prompt_tokens"] for b in bodies)
    assert bodies[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > first  # prompt and answer both held
    assert stats.prefill_tokens < first + second - first


def test_a_cache_too_small_for_the_prefix_thrashes():
    prompts = [[SYSTEM, {"role": "user", "content": f"Question {i}?"}] for i in range(3)]
    bodies, stats = _ask(_sim(prefix_cache_tokens=30), prompts)
    assert all(b["usage"]["prompt_tokens_details"]["cached_tokens"] <= 30 for b in bodies)
    assert stats.prefill_tokens >= stats.prompt_tokens - 60


def test_requests_arriving_together_prefill_one_at_a_time_and_share_the_prefix():
    """As SGLang's prefill batches: the second of two requests sent at once finds the system prompt the first
    inserted."""
    cfg = _sim(prefix_cache_tokens=10_000)
    prompts = [[SYSTEM, {"role": "user", "content": f"Question {i}?"}] for i in range(2)]

    async def scenario() -> list[int]:
        async with await start_fleet(cfg) as fleet, aiohttp.ClientSession() as session:
            bodies = await asyncio.gather(*(_chat(session, fleet.urls[0], p) for p in prompts))
            return sorted(b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in bodies)

    none, shared = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert none == 0 and shared > 500


def test_each_servers_prefill_paid_is_in_the_summary(write_jsonl, tmp_path):
    """summary.json gives each server's prefill_tokens (prompt tokens its cache did not serve): what the
    simulated servers paid, added up."""
    rows = [{"id": i, "messages": [SYSTEM, {"role": "user", "content": f"Question {i}?"}]} for i in range(12)]
    sim = {"n_ports": 2, "prefix_cache_tokens": 50_000}
    outcome, fleet = run_sim(write_jsonl(rows), tmp_path / "out", sim=sim)
    views = outcome.summary["servers"].values()
    paid = sum(v["prefill_tokens"] or 0 for v in views)  # None: a server that got no request (one holds them)
    assert paid == sum(s.prefill_tokens for s in fleet.stats.values())
    assert 0 < paid < sum(v["prompt_tokens"] for v in views)
    assert "prefill paid" in format_summary(outcome.summary)


def test_status_and_report_show_each_servers_cache_share_and_prefill(write_jsonl, tmp_path):
    """`status` and `report` give each server's prefix-cache share and the prefill it paid, as the summary
    does (where the server reports cached tokens): they showed neither."""
    from gen_pipeline.views.report import render_table
    from gen_pipeline.views.rundata import read_completions
    from gen_pipeline.views.statustext import render_status

    rows = [{"id": i, "messages": [SYSTEM, {"role": "user", "content": f"Question {i}?"}]} for i in range(12)]
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, sim={"n_ports": 2, "prefix_cache_tokens": 50_000})
    status = orjson.loads((out / "status.json").read_bytes())
    served = {u: v for u, v in outcome.summary["servers"].items() if v["prompt_tokens"]}
    for url, view in served.items():
        line = next(x for x in render_status(status).splitlines() if url in x)
        share = 100 * view["cached_tokens"] / view["prompt_tokens"]
        assert f"cached {share:.0f}%" in line and f"prefill {view['prefill_tokens']:,} tok" in line
    table = render_table(out, read_completions(out), outcome.summary, None)
    assert all(f"prefill {v['prefill_tokens']:,} tok" in table for v in served.values())
