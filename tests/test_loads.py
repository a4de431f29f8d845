"""Capacity from the servers' own load reports: the simulator's KV-pool admission, the adjustment rule, and runs
whose start-up capacity the pool does not admit."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from e2e import check_invariant, run_sim

from gen_pipeline.config import RunConfig
from gen_pipeline.engine.setup import build_pool
from gen_pipeline.errors import ConnectError
from gen_pipeline.fleet import loads
from gen_pipeline.fleet.balancer import ServerPool
from gen_pipeline.fleet.discovery import FleetInfo, ServerInfo, probe
from gen_pipeline.fleet.loads import Load, LoadSource, Trend, adjust, parse_load, watch_loads
from gen_pipeline.fleet.pacing import queue_margin
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.http import Client, open_transport
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
        cfg = SimConfig(ports=tuple(free_ports(1)), token_latency=0.04, kv_admission=kv_admission, **REAL)
        async with await start_fleet(cfg) as fleet, aiohttp.ClientSession() as session:
            url = fleet.urls[0]
            sent = [asyncio.create_task(_chat(session, url, i, max_tokens)) for i in range(n)]
            # until every request has arrived; each runs 0.4-2 s, so that none of the first wave has ended by the
            # load report below, on a busy machine too (at 0.1-0.5 s one had, now and then: (8, 7))
            for _ in range(2000):
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


def _long_prompts(n: int) -> list[dict[str, Any]]:
    """`n` distinct chat rows of 450 to 500 tokens each (the tiny tokenizer)."""
    return [
        {"id": i, "messages": [{"role": "user", "content": f"Q{i}: " + "tell me more " * (48 + i % 7)}]}
        for i in range(n)
    ]


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Poll the loads four times a second, so that a run of a few seconds sees a dozen samples."""
    monkeypatch.setattr(loads, "LOADS_INTERVAL", 0.25)


def test_capacity_follows_what_the_pool_admits(write_jsonl, tmp_path, fast_polls):
    """Start-up capacity 64 (slots 64; pool 4096 // max_tokens 64), but prompts of ~470 tokens leave room in the
    pool for 7 at a time: each server's capacity ends near what its pool runs, every row completed once."""
    rows = _long_prompts(240)
    out = tmp_path / "out"
    sim = {"n_ports": 2, "kv_admission": True, "max_total_tokens": 4096, "context_length": 2048}
    outcome, fleet = run_sim(write_jsonl(rows), out, {**sim, "token_latency": 0.01}, timeout=30)
    assert outcome.exit_code == 0
    assert check_invariant([r["id"] for r in rows], out) == {"done": 240, "ledger": 0}
    servers = outcome.summary["servers"]
    for url, stats in zip(fleet.urls, fleet.stats.values(), strict=True):
        assert stats.max_running == 7  # what the pool admits at once
        assert servers[url]["capacity_source"] == "loads endpoint"
        assert 6 <= servers[url]["capacity"] <= 8, servers[url]
        assert servers[url]["capacity_range"] == [servers[url]["capacity"], 64]
        # the queue kept at the server shrinks with the capacity: a short queue, not the 8 of a capacity of 64
        assert servers[url]["queue_margin"] == queue_margin(servers[url]["capacity"]) == 2


def test_capacity_the_server_runs_is_left_alone(write_jsonl, tmp_path, fast_polls):
    """Without KV-pool admission the same run's servers run all 64 + 8 sent: capacity stays the start-up 64."""
    rows = _long_prompts(240)
    out = tmp_path / "out"
    sim = {"n_ports": 2, "max_total_tokens": 4096, "context_length": 2048, "token_latency": 0.01}
    outcome, fleet = run_sim(write_jsonl(rows), out, sim, timeout=30)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 240
    assert [s["capacity"] for s in outcome.summary["servers"].values()] == [64, 64]
    assert [s["capacity_range"] for s in outcome.summary["servers"].values()] == [[64, 64]] * 2
    assert max(s.max_running for s in fleet.stats.values()) > 7


def _walk(capacity: int, samples: list[tuple[int, int, float | None, int]], ceiling: int = 64, share: int = 1):
    """The capacities after each of (running, waiting, token_usage, in_flight) samples, from `capacity`."""
    trend, seen = Trend(), []
    for running, waiting, usage, in_flight in samples:
        capacity, trend = adjust(capacity, ceiling, in_flight, Load(running, waiting, usage), trend, share)
        seen.append(capacity)
    return seen


WAITING = (7, 60, 0.95, 72)  # it runs 7 of the 72 sent, 60-odd wait
ROOM = (9, 0, 0.5, 9)  # it runs all 9 sent, its pool half full


@pytest.mark.parametrize(
    ("start", "samples", "seen"),
    [
        (64, [WAITING], [64]),  # one sample changes nothing
        (64, [WAITING, WAITING, WAITING], [64, 64, 7]),  # requests wait: capacity is what it runs
        (64, [(7, 60, None, 72), (5, 62, None, 72), (6, 61, None, 72)], [64, 64, 7]),  # the most run of the three
        (64, [(0, 5, None, 5)] * 3, [64, 64, 1]),  # never below 1
        (4, [WAITING] * 3, [4, 4, 7]),  # it runs more than thought while requests wait: up to what it runs
        (7, [WAITING, ROOM] * 4, [7] * 8),  # samples that disagree change nothing
        (7, [ROOM] * 3, [7, 7, 8]),  # room, kept full, pool under 0.9: one step up
        (8, [(20, 0, 0.5, 20)] * 6, [8, 8, 10, 10, 10, 12]),  # step by step (a quarter, at least one)
        (7, [(9, 0, 0.95, 9)] * 4, [7] * 4),  # pool over 0.9: full already
        (7, [(5, 0, 0.5, 5)] * 4, [7] * 4),  # not kept full (in flight under capacity): no evidence of room
        (62, [(66, 0, 0.5, 66)] * 3, [62, 62, 64]),  # never above the ceiling
        (64, [(66, 0, 0.5, 66)] * 4, [64] * 4),  # at the ceiling already
    ],
)
def test_adjust_rule(start: int, samples: list[tuple[int, int, float | None, int]], seen: list[int]) -> None:
    """Capacity moves only after CONFIRM samples agree: down (or up) to what runs while requests wait, up a
    step while everything sent runs and the pool has room; within [1, ceiling]."""
    assert _walk(start, samples) == seen


def test_adjust_shares_what_runs_between_claimers() -> None:
    """With --workers 2, each claimer's part of the 14 the server runs is 7."""
    assert _walk(64, [(14, 50, None, 36)] * 3, share=2)[-1] == 7


def test_adjust_does_not_see_saw_on_a_pool_just_short_of_the_raise() -> None:
    """A raise that the pool cannot hold is taken back, and the next raise waits twice as long: over a long run
    against a pool that admits 7, capacity sits at 7 far more than it probes 8."""
    capacity, trend, seen = 7, Trend(), []
    for _ in range(120):
        # it runs 7; while capacity is 8 one of the 8+ sent waits, else everything sent runs with room in the pool
        sample = Load(7, 1, 0.85) if capacity > 7 else Load(7, 0, 0.85)
        capacity, trend = adjust(capacity, 64, capacity, sample, trend)
        seen.append(capacity)
    assert set(seen) == {7, 8}
    assert seen.count(8) <= 0.2 * len(seen)  # without the doubling: half the time
    changes = sum(a != b for a, b in itertools.pairwise(seen))
    assert changes <= 12  # each probe waits longer than the last (doubling to MAX_PATIENCE)


@pytest.mark.parametrize(
    ("body", "load"),
    [
        ({"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 2, "token_usage": 0.5}]}, Load(3, 2, 0.5)),
        ({"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 0}]}, Load(3, 0, None)),
        ({"loads": [{"num_running_reqs": 3}]}, None),
        ({"loads": [{"num_running_reqs": True, "num_waiting_reqs": 0}]}, None),
        ({"loads": []}, None),
        ([], None),
    ],
)
def test_parse_load(body: Any, load: Load | None) -> None:
    """The first rank's running and waiting counts and token usage; anything else is no sample."""
    assert parse_load(body) == load


class FakeClient:
    """Answers GET /v1/loads from a script of bodies (an exception is raised), recording who was asked."""

    def __init__(self, bodies: list[Any], polls: int) -> None:
        self.bodies, self.asked, self.polls = bodies, [], polls
        self.done = asyncio.Event()

    async def get_json(self, url: str, path: str, timeout: float) -> Any:
        self.asked.append((url, path))
        if len(self.asked) >= self.polls:
            self.done.set()
        body = self.bodies[min(len(self.asked), len(self.bodies)) - 1]
        if isinstance(body, Exception):
            raise body
        return body


def _watch(servers: list[ServerState], client: FakeClient) -> None:
    async def scenario() -> None:
        task = asyncio.create_task(watch_loads(ServerPool(servers), client, interval=0))  # type: ignore[arg-type]
        await client.done.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def _busy(running: int, waiting: int) -> dict[str, Any]:
    return {"loads": [{"num_running_reqs": running, "num_waiting_reqs": waiting, "token_usage": 0.95}]}


def test_watcher_polls_only_servers_that_report_loads_and_ignores_failures() -> None:
    """A server with no ceiling (no /v1/loads at discovery, or --concurrency) is never asked and keeps its
    capacity; a failed poll is skipped; the watched one ends at what it runs, its range kept for the summary."""
    watched = ServerState("http://a", 64, margin=8, ceiling=64, loads=LoadSource.SGLANG)
    plain = ServerState("http://b", 64, margin=8)
    watched.in_flight = plain.in_flight = 72
    client = FakeClient([_busy(7, 65), ConnectError("refused"), _busy(7, 65), _busy(6, 66), _busy(7, 65)], polls=6)
    _watch([watched, plain], client)
    assert {url for url, _ in client.asked} == {"http://a"} and {p for _, p in client.asked} == {"/v1/loads"}
    assert (watched.capacity, watched.margin, watched.capacity_low, watched.capacity_high) == (7, 8, 7, 64)
    assert (plain.capacity, plain.capacity_low, plain.capacity_high) == (64, 0, 0)


class VllmLike:
    """A server that answers like vLLM (no /v1/loads in its discovery) but would answer /v1/loads if asked,
    recording every path it was asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 2048}]})
        if request.path == "/v1/loads":
            return web.json_response(_busy(1, 5))
        return web.json_response({"detail": "Not Found"}, status=404)


def test_discovery_finds_loads_only_on_sglang_and_build_pool_watches_only_those(tmp_path) -> None:
    """An SGLang server (the simulator) answers /v1/loads at discovery, also when it reports its slots; a vLLM
    one is never asked. Only the first gets a ceiling (is watched), and none with --concurrency."""

    async def vllm_paths() -> tuple[ServerInfo, list[str]]:
        fake = VllmLike()
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", fake.handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with open_transport() as transport:
                info = await probe(Client(transport), str(server.make_url("")).rstrip("/"))
        finally:
            await server.close()
        return info, fake.paths

    vllm, paths = asyncio.run(asyncio.wait_for(vllm_paths(), 10))
    assert vllm.kind == "vllm" and not vllm.loads and "/v1/loads" not in paths

    async def sglang_info(report: bool) -> ServerInfo:
        cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, report_max_running=report)
        async with await start_fleet(cfg) as fleet, open_transport() as transport:
            return await probe(Client(transport), fleet.urls[0])

    for report in (False, True):
        assert asyncio.run(asyncio.wait_for(sglang_info(report), 10)).loads

    sglang = ServerInfo("http://s:1", "m", 2048, max_running_requests=32, kind="sglang", loads=LoadSource.SGLANG)
    other = ServerInfo("http://v:1", "m", 2048, kind="vllm")
    for concurrency, ceilings in ((None, [32, None]), (16, [None, None])):
        config = RunConfig(
            input=tmp_path / "in.jsonl", out=tmp_path / "out", servers=(sglang.url, other.url), concurrency=concurrency
        )
        pool = build_pool(config, FleetInfo([sglang, other], []), open_files=65536)
        assert [s.ceiling for s in pool.servers] == ceilings


def test_summary_view_shows_the_range_only_for_watched_servers() -> None:
    """summary.json per server: capacity_range [least, most] where the load watcher moves capacity; claimers'
    parts add up end by end, as their capacities do."""
    from gen_pipeline.engine.summary import SUMMARY_RULES

    watched, plain = ServerState("http://a", 64, ceiling=64, loads=LoadSource.SGLANG), ServerState("http://b", 64)
    watched.set_capacity(7)
    watched.set_capacity(9)
    assert watched.view(0.0)["capacity_range"] == [7, 64] and watched.view(0.0)["capacity"] == 9
    assert "capacity_range" not in plain.view(0.0)
    merge = SUMMARY_RULES["servers"].rules["capacity_range"].combine
    assert merge([[7, 64], [4, 32], None]) == [11, 96] and merge([None]) is None


def test_a_margin_that_follows_the_capacity_moves_with_it_and_a_set_one_does_not() -> None:
    """The queue margin derived from the capacity (pacing.queue_margin) follows the load watcher's capacity, so
    the server's own queue stays short but non-empty; one set by --queue-margin stays as set."""
    follows, fixed = ServerState("http://a", 64, margin=8, margin_follows=True), ServerState("http://b", 64, margin=5)
    for capacity, margin in ((7, 2), (64, 8), (200, 25)):
        follows.set_capacity(capacity)
        fixed.set_capacity(capacity)
        assert (follows.margin, fixed.margin) == (margin, 5)


def test_workers_are_sized_for_the_capacity_a_server_may_be_raised_to() -> None:
    """The pool's workers cover every watched server at its ceiling, with the queue margin there, so a raised
    capacity is not starved by a worker count sized at start; a server not watched counts at its limit."""
    grows = ServerState("http://a", 64, margin=8, margin_follows=True, ceiling=256, loads=LoadSource.SGLANG)
    plain = ServerState("http://b", 16, margin=2)
    assert (grows.most(), plain.most()) == (256 + 32, 16 + 2)
    assert ServerPool([grows, plain]).worker_count() == 2 * (288 + 18)
