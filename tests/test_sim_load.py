"""The simulator's latency model and load counters, and its instant-502 fault: what bench/balance.py reads."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
import pytest

from gen_pipeline.sim import SimConfig, add_arguments, free_ports, start_fleet
from gen_pipeline.sim.cli import config_from_args

PROMPT = [{"role": "user", "content": "how long does this take"}]


async def _chat(session: aiohttp.ClientSession, url: str, max_tokens: int) -> tuple[int, Any]:
    body = {"model": "sim-model", "messages": PROMPT, "max_tokens": max_tokens}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.json(content_type=None)


def _serve_and_send(cfg: SimConfig, n: int) -> tuple[list[tuple[int, Any]], Any]:
    """Send `n` chat requests at once to the first port; its replies and counters."""

    async def scenario() -> tuple[list[tuple[int, Any]], Any]:
        async with await start_fleet(cfg) as fleet, aiohttp.ClientSession() as session:
            replies = await asyncio.gather(*(_chat(session, fleet.urls[0], 8 + i % 5) for i in range(n)))
            return list(replies), fleet.stats[cfg.ports[0]]

    return asyncio.run(asyncio.wait_for(scenario(), 30))


def test_bad_gateway_answers_a_fraction_with_a_502_before_any_work() -> None:
    """About P of the requests get a 502 that never held a slot; the rest complete."""
    port = free_ports(1)[0]
    cfg = SimConfig(ports=(port,), health_delay=0.0, token_latency=0.002, bad_gateway={port: 0.3})
    replies, stats = _serve_and_send(cfg, 200)
    failed = [status for status, _ in replies if status != 200]
    assert set(failed) == {502} and 0.18 <= len(failed) / 200 <= 0.42
    assert stats.errors == len(failed) and stats.completions == 200 - len(failed)


def test_latency_model_and_load_counters() -> None:
    """Slots are held for prompt and output tokens at the model's rates, and the counters add them up."""
    port = free_ports(1)[0]
    cfg = SimConfig(ports=(port,), health_delay=0.0, token_latency=0.004, prompt_token_latency=0.001, max_running=4)
    replies, stats = _serve_and_send(cfg, 20)
    usage = [body["usage"] for status, body in replies if status == 200]
    assert len(usage) == 20
    model = sum(u["completion_tokens"] * 0.004 + u["prompt_tokens"] * 0.001 for u in usage)
    assert stats.model_s == pytest.approx(model)
    assert stats.busy_s >= 0.99 * model and stats.output_tokens == sum(u["completion_tokens"] for u in usage)
    assert stats.max_running == 4 and stats.first_request_at < stats.last_reply_at


def test_cli_flags_for_the_new_knobs() -> None:
    """--bad-gateway PORT:P and --prompt-token-latency reach the config."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--ports", "31000-31001", "--bad-gateway", "31001:0.3", "--prompt-token-latency", "5e-6"])
    cfg = config_from_args(args)
    assert dict(cfg.bad_gateway) == {31001: 0.3} and cfg.prompt_token_latency == 5e-6
