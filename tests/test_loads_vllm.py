"""Capacity from a vLLM server's own load report: its Prometheus `/metrics`, found at discovery, polled by the
load watcher, and read into the same Load as SGLang's `/v1/loads`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gen_pipeline.config import RunConfig
from gen_pipeline.engine.setup import build_pool
from gen_pipeline.fleet.balancer import ServerPool
from gen_pipeline.fleet.capacity import GUESS_GROWTH
from gen_pipeline.fleet.discovery import FleetInfo, ServerInfo, probe
from gen_pipeline.fleet.loads import Load, LoadSource, parse_metrics, watch_loads
from gen_pipeline.fleet.provenance import ServerIdentity
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.http import Client, open_transport

VLLM = ServerIdentity(kind="vllm", version=None, model_path=None, weight_version=None, served_model_name=None)


def metrics(running: int, waiting: int, usage: float = 0.95, usage_name: str = "vllm:kv_cache_usage_perc") -> str:
    """vLLM's /metrics text as a server with two engines writes it: each count split between them, both at `usage`,
    among series the watcher does not read."""
    first, second = running // 2, running - running // 2
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {float(first)}\n'
        f'vllm:num_requests_running{{engine="1",model_name="m"}} {float(second)}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {float(waiting)}\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0\n'
        f"# TYPE {usage_name} gauge\n"
        f'{usage_name}{{engine="0",model_name="m"}} {usage}\n'
        f'{usage_name}{{engine="1",model_name="m"}} {usage}\n'
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 3.0\n'
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0\n'
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 4.0\n'
        'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.5\n'
    )


def series(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


COUNTS = ("vllm:num_requests_running 4", "vllm:num_requests_waiting 1")  # one unlabelled engine


@pytest.mark.parametrize(
    ("text", "load"),
    [
        (metrics(7, 65), Load(7, 65, 0.95)),  # counts summed over the engines' label sets
        (metrics(7, 65, 0.5, "vllm:gpu_cache_usage_perc"), Load(7, 65, 0.5)),  # the usage gauge's old name
        (
            series(
                'vllm:num_requests_running{engine="0"} 1',
                'vllm:num_requests_running{engine="1"} 2',
                "vllm:num_requests_waiting 0",
                'vllm:kv_cache_usage_perc{engine="0"} 0.25',
                'vllm:kv_cache_usage_perc{engine="1"} 0.75',
                "vllm:gpu_cache_usage_perc 0.9",
            ),
            Load(3, 0, 0.5),  # each engine has its own pool: their mean; the current name before the old one
        ),
        (series(*COUNTS), Load(4, 1, None)),  # no usage gauge
        (series(*COUNTS, "vllm:kv_cache_usage_perc NaN"), Load(4, 1, None)),
        (series("vllm:num_requests_running 4"), None),  # no waiting series
        (series("vllm:num_requests_waiting 4"), None),  # no running series
        (series("vllm:num_requests_running 2.5", "vllm:num_requests_waiting 0"), None),  # not a count
        (series("vllm:num_requests_running -1", "vllm:num_requests_waiting 0"), None),
        (series("vllm:num_requests_running NaN", "vllm:num_requests_waiting 0"), None),
        (series("sglang:num_running_reqs 4", "sglang:num_queue_reqs 1"), None),  # another server's series
        ("", None),
        ("<html><body>Not Found</body></html>", None),  # garbage the parser refuses
        ('{"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 2}]}', None),
        ('vllm:num_requests_running{engine="0} 1\nvllm:num_requests_waiting 0\n', None),
    ],
)
def test_parse_metrics(text: str, load: Load | None) -> None:
    """Running and waiting requests summed over their label sets, the KV-cache usage under either name; text
    without both counts, or that does not parse, is no sample."""
    assert parse_metrics(text) == load


class FakeVllm:
    """A vLLM-like server: its model card, /version and, unless `bodies` is None, /metrics answered from a
    script of bodies (the last one repeated); it records every path asked and sets `polled` at the
    `polls`-th request for a load (/metrics, or /v1/loads, which it does not have)."""

    def __init__(self, bodies: list[str] | None, polls: int = 1) -> None:
        self.bodies, self.polls, self.paths = bodies, polls, []
        self.polled = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        if sum(p in ("/metrics", "/v1/loads") for p in self.paths) >= self.polls:
            self.polled.set()
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 2048, "root": "/m"}]})
        if request.path == "/version":
            return web.json_response({"version": "0.32.0"})
        if request.path == "/metrics" and self.bodies is not None:
            asked = self.paths.count("/metrics")
            return web.Response(text=self.bodies[min(asked, len(self.bodies)) - 1], content_type="text/plain")
        return web.json_response({"detail": "Not Found"}, status=404)


@contextlib.asynccontextmanager
async def serving(*fakes: FakeVllm) -> AsyncIterator[tuple[Client, list[str]]]:
    """The fakes on 127.0.0.1, and a client to ask them."""
    servers = []
    for fake in fakes:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", fake.handle)
        servers.append(TestServer(app, host="127.0.0.1"))
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            await stack.enter_async_context(server)
        transport = await stack.enter_async_context(open_transport())
        yield Client(transport), [str(s.make_url("")).rstrip("/") for s in servers]


async def watch_until_polled(pool: ServerPool, client: Client, fake: FakeVllm) -> None:
    """Run the load watcher until `fake` has been asked for its load `polls` times, or until the watcher ends
    by itself (it watches no server)."""
    watcher = asyncio.create_task(watch_loads(pool, client, interval=0))
    polled = asyncio.create_task(fake.polled.wait())
    await asyncio.wait({watcher, polled}, return_when=asyncio.FIRST_COMPLETED)
    for task in (watcher, polled):
        task.cancel()
    await asyncio.gather(watcher, polled, return_exceptions=True)


def test_discovery_reads_a_vllm_servers_load_from_its_metrics_when_it_has_them() -> None:
    """A vLLM server whose /metrics has the series is watched there (never asked /v1/loads); one without
    /metrics is not watched."""

    async def scenario() -> tuple[ServerInfo, ServerInfo, FakeVllm]:
        with_metrics, without = FakeVllm([metrics(0, 0, 0.0)]), FakeVllm(None)
        async with serving(with_metrics, without) as (client, urls):
            return await probe(client, urls[0]), await probe(client, urls[1]), with_metrics

    watched, plain, fake = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert (watched.kind, watched.loads) == ("vllm", LoadSource.VLLM)
    assert (plain.kind, plain.loads) == ("vllm", None)
    assert "/metrics" in fake.paths and "/v1/loads" not in fake.paths


def test_watcher_lowers_a_vllm_servers_capacity_while_its_metrics_show_requests_waiting() -> None:
    """A watched vLLM server running 7 of the 72 sent, the rest waiting, ends at capacity 7, read from
    /metrics alone; a poll that does not parse is skipped; a server with no ceiling is never asked."""

    async def scenario() -> tuple[ServerState, ServerState, FakeVllm, FakeVllm]:
        busy = metrics(7, 65)
        watched_fake = FakeVllm([busy, "<html>busy</html>", busy, busy, busy], polls=5)
        plain_fake = FakeVllm([busy])
        async with serving(watched_fake, plain_fake) as (client, urls):
            watched = ServerState(urls[0], 64, ceiling=64, identity=VLLM, loads=LoadSource.VLLM)
            plain = ServerState(urls[1], 64, identity=VLLM)
            watched.in_flight = plain.in_flight = 72
            await watch_until_polled(ServerPool([watched, plain]), client, watched_fake)
        return watched, plain, watched_fake, plain_fake

    watched, plain, watched_fake, plain_fake = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert set(watched_fake.paths) == {"/metrics"} and plain_fake.paths == []
    assert (watched.capacity, watched.capacity_range()) == (7, [7, 64])
    assert (plain.capacity, plain.capacity_range()) == (64, [64, 64])


def test_a_vllm_server_watched_through_its_metrics_shows_its_capacity_range(tmp_path: Any) -> None:
    """Discovery, the pool and the watcher together: the vLLM server with /metrics gets a ceiling and its
    summary view the range its capacity moved through; the one without keeps 64 and shows none."""

    async def scenario() -> tuple[list[int | None], list[dict[str, object]]]:
        with_metrics, without = FakeVllm([metrics(0, 0, 0.0), metrics(7, 65)], polls=5), FakeVllm(None)
        async with serving(with_metrics, without) as (client, urls):
            fleet = FleetInfo([await probe(client, url) for url in urls], [])
            config = RunConfig(input=tmp_path / "in.jsonl", out=tmp_path / "out", servers=tuple(urls))
            pool = build_pool(config, fleet, open_files=65536)
            for server in pool.servers:
                server.in_flight = 72
            await watch_until_polled(pool, client, with_metrics)
        return [s.ceiling for s in pool.servers], [s.view(0.0) for s in pool.servers]

    ceilings, (watched, plain) = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert ceilings == [64 * GUESS_GROWTH, None]  # a guess, watched: it may grow past it
    assert (watched["capacity"], watched["capacity_source"], watched["capacity_range"]) == (7, "default", [7, 64])
    assert plain["capacity"] == 64 and "capacity_range" not in plain


def test_a_guessed_vllm_server_that_runs_all_it_is_sent_grows_past_the_guess(tmp_path: Any) -> None:
    """A vLLM server reports no running slots: it starts at the guess of 64 with a queue margin (its load is
    watched), and while its /metrics show all 72 sent running, nothing waiting and its KV cache a third full, its
    capacity grows past 64 (the guess is not its ceiling) and the margin with it; the workers are sized for 4x."""

    async def scenario() -> ServerPool:
        fake = FakeVllm([metrics(0, 0, 0.0)] + [metrics(72, 0, 0.3)] * 8, polls=9)
        async with serving(fake) as (client, urls):
            fleet = FleetInfo([await probe(client, urls[0])], [])
            config = RunConfig(input=tmp_path / "in.jsonl", out=tmp_path / "out", servers=tuple(urls))
            pool = build_pool(config, fleet, open_files=65536)
            (server,) = pool.servers
            assert (server.capacity, server.margin, server.ceiling) == (64, 8, 256)
            server.in_flight = server.limit  # kept full: all it is sent runs
            await watch_until_polled(pool, client, fake)
        return pool

    pool = asyncio.run(asyncio.wait_for(scenario(), 10))
    (server,) = pool.servers
    assert server.capacity == 80 and server.margin == 10  # one raise of a quarter: 72 in flight < 80 after it
    assert server.capacity_range() == [64, 80]
    assert pool.worker_count() == 2 * (256 + 32)


def test_a_guessed_ceiling_is_the_start_figure_when_open_files_are_short(tmp_path: Any) -> None:
    """Growth past the guess needs a socket per request: where the open-file limit does not hold 4x the guess,
    the watched server's ceiling stays the start-up figure; the guess warning says how far it may follow."""
    info = ServerInfo("http://v:1", "m", 2048, kind="vllm", loads=LoadSource.VLLM)
    config = RunConfig(input=tmp_path / "in.jsonl", out=tmp_path / "out", servers=(info.url,))
    for open_files, ceiling in ((65536, 256), (200, 64)):
        fleet = FleetInfo([info], [])
        (server,) = build_pool(config, fleet, open_files=open_files).servers
        assert (server.capacity, server.ceiling) == (64, ceiling)
        (warning,) = fleet.warnings  # the guess is named, and how far the server may follow its load
        assert "is a guess" in warning and f"follow what they run, up to {ceiling}" in warning
