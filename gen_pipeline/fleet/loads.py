"""Each server's capacity from what it reports about its own load, not from the start-up figure alone.

On SGLang the KV token pool, not the running slots, decides how many requests run at once: an admitted request
reserves its prompt plus its max_tokens (clipped at 4096), and what does not fit waits in the server's queue
(../shared/reference/sglang-cpu.md: 2048 slots, a pool of 8192, 16 requests of max_tokens 1000 ran 8 at a
time). The start-up figure (capacity.py: slots capped by pool // max_tokens) cannot count the prompts, so it
may be more than the pool admits. SGLang's `/v1/loads` says, exactly and within a quarter second, how many
requests run (`num_running_reqs`), how many wait (`num_waiting_reqs`) and how full the pool is
(`token_usage`). SGLang's batch-throughput advice is to keep its queue non-empty and its token usage above
0.9: a server with requests waiting runs all it can, so what it runs then is its concurrency; one that runs
all it is sent with its pool well under 0.9 could take more.

vLLM says the same on `GET /metrics` (on by default), as Prometheus text: `vllm:num_requests_running`,
`vllm:num_requests_waiting` and the KV-cache usage, a 0..1 fraction whatever its name
(`vllm:kv_cache_usage_perc`, `vllm:gpu_cache_usage_perc` before it). Each series has one sample per label
set (model_name, engine): the counts are summed, the usage is the engines' mean (each has a pool of its own).
`parse_load` and `parse_metrics` turn either answer into the same `Load`; what follows does not know which.

So the watcher polls each server's `LoadSource` about once a second, one short request a server, on the
servers whose discovery found it answering (SGLang's /v1/loads, vLLM's /metrics; never llama.cpp, nor a
vLLM without those series, which keep their start-up capacity; never with --concurrency), and `adjust`
moves each one's `ServerState.capacity` (read live by the balancer; a queue margin derived from the capacity
follows it, so the server's own queue stays short but non-empty: ServerState.margin_follows):
  * requests waiting (CONFIRM samples in a row): capacity becomes the most it ran over those samples;
  * nothing waiting while we keep it full (in flight >= capacity) and its pool under FULL_USAGE: capacity
    grows by RAISE_FRACTION (at least 1) after `patience` samples in a row.
Never below 1, never above `ServerState.ceiling`: the start-up figure, or where that is only the default guess
(vLLM reports no running slots) capacity.GUESS_GROWTH times it; the Runner's workers and the open-file fit are
sized for the ceiling at start (engine/setup.py build_pool). One sample never changes anything, and a raise
that had to be taken back doubles the samples the next raise needs (up to MAX_PATIENCE), so a pool that admits
a little less than the raise does not see-saw. A failed poll, or an answer without the counts (a body that does
not parse, a series missing), is skipped quietly: the health of a server is judged by its answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from ..errors import RequestError
from ..http import Client
from .balancer import ServerPool
from .state import LoadSource, ServerState

log = logging.getLogger("gen_pipeline")

LOADS_INTERVAL = 1.0  # seconds between two polls of a server
LOADS_TIMEOUT = 2.0  # a poll takes ~4 ms on SGLang; a slower one is skipped
CONFIRM = 3  # samples in a row that must agree before capacity is lowered (and, at first, raised)
MAX_PATIENCE = 24  # the most samples in a row a raise may need
FULL_USAGE = 0.9  # SGLang's advice: token usage above this is a full server
RAISE_FRACTION = 0.25  # a raise adds this share of the capacity (at least one request)
# vLLM's series on /metrics; the KV-cache gauge (a 0..1 fraction) under its current name first, then its old one
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
VLLM_SERIES = (VLLM_RUNNING, VLLM_WAITING, *VLLM_USAGE)


@dataclass(frozen=True)
class Load:
    """One sample of a server's load (SGLang: its first DP rank; vLLM: all its engines)."""

    running: int
    waiting: int
    token_usage: float | None = None  # None: not reported


@dataclass(frozen=True)
class Trend:
    """What the watcher remembers of one server between samples."""

    kind: str = ""  # "waiting", "room" or "" (neither): what the last samples in a row showed
    count: int = 0  # how many samples in a row showed it
    running: int = 0  # the most requests (this process's part) running over those samples
    patience: int = CONFIRM  # samples in a row a raise needs
    last: str = ""  # the last change made: "lower", "raise" or ""


def parse_load(body: Any) -> Load | None:
    """The first rank's load from a `/v1/loads` body (None: not one)."""
    loads = body.get("loads") if isinstance(body, dict) else None
    first = loads[0] if isinstance(loads, list) and loads and isinstance(loads[0], dict) else {}
    running, waiting = _count(first.get("num_running_reqs")), _count(first.get("num_waiting_reqs"))
    if running is None or waiting is None:
        return None
    if isinstance(usage := first.get("token_usage"), int | float) and not isinstance(usage, bool):
        return Load(running, waiting, float(usage))
    return Load(running, waiting)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_metrics(text: str) -> Load | None:
    """vLLM's load from its `/metrics` text: running and waiting requests each summed over their label sets
    (model_name, engine), and the mean KV-cache usage of its engines (None: not Prometheus text, or no counts)."""
    try:
        series = _series(text, VLLM_SERIES)
    except ValueError:  # the parser's one error for text that is not the exposition format
        return None
    running, waiting = _total(series.get(VLLM_RUNNING)), _total(series.get(VLLM_WAITING))
    if running is None or waiting is None:
        return None
    return Load(running, waiting, _mean(next((series[name] for name in VLLM_USAGE if name in series), [])))


def _series(text: str, names: tuple[str, ...]) -> dict[str, list[float]]:
    """The values of the samples on lines that begin with one of `names`, by sample name, one per label set."""
    # imported here, as engine/metrics.py does: a run that watches no vLLM server never loads prometheus_client
    from prometheus_client.parser import text_string_to_metric_families

    # only those lines: vLLM 0.32's whole text (56 KB, 642 lines, mostly histograms) takes 8 ms to parse, in the
    # event loop, once a second a server; its five lines of these series take 0.2 ms
    kept = "\n".join(line for line in text.splitlines() if line.startswith(names))
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(kept):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample.value)
    return found


def _total(values: list[float] | None) -> int | None:
    """A request count summed over its label sets (None: absent, or not a whole number of requests)."""
    total = math.fsum(values) if values else math.nan
    return int(total) if total.is_integer() and total >= 0 else None


def _mean(usages: list[float]) -> float | None:
    """The KV-cache usage of a server whose engines each have a pool of their own (None: not reported)."""
    mean = math.fsum(usages) / len(usages) if usages else math.nan
    return mean if math.isfinite(mean) and mean >= 0 else None


def _kind(load: Load, capacity: int, in_flight: int, ceiling: int) -> str:
    """What one sample shows: requests waiting; room for more while we keep the server full; or neither."""
    if load.waiting > 0:
        return "waiting"
    full_pool = load.token_usage is not None and load.token_usage >= FULL_USAGE
    return "room" if in_flight >= capacity and capacity < ceiling and not full_pool else ""


def adjust(capacity: int, ceiling: int, in_flight: int, load: Load, trend: Trend, share: int = 1) -> tuple[int, Trend]:
    """A server's capacity after one more sample, and the trend to keep; `share`: the claimers of this node that
    split the server (--workers K), each taking its part of what it runs (rounded up, as config.capacity_for)."""
    kind = _kind(load, capacity, in_flight, ceiling)
    running = -(-load.running // share)
    same = kind == trend.kind
    trend = replace(trend, kind=kind, count=trend.count + 1 if same else 1)
    trend = replace(trend, running=max(trend.running, running) if same else running)
    if kind == "waiting" and trend.count >= CONFIRM:
        target = min(ceiling, max(1, trend.running))
        if target == capacity:  # confirmed: the next window of samples starts afresh
            return capacity, replace(trend, kind="", count=0, running=0)
        bounced = trend.last == "raise" and target < capacity
        patience = min(MAX_PATIENCE, trend.patience * 2) if bounced else trend.patience
        return target, Trend(patience=patience, last="lower" if target < capacity else "raise")
    if kind == "room" and trend.count >= trend.patience:
        target = min(ceiling, capacity + max(1, int(capacity * RAISE_FRACTION)))
        held = trend.last == "raise"  # the last raise was kept: the next may come sooner
        return target, Trend(patience=max(CONFIRM, trend.patience // 2) if held else trend.patience, last="raise")
    return capacity, trend


async def fetch_load(client: Client, url: str, source: LoadSource, timeout: float) -> Load | None:
    """One server's load now from `source` (None: an answer that is not a load); a failed request raises."""
    if source is LoadSource.SGLANG:
        return parse_load(await client.get_json(url, source.value, timeout))
    return parse_metrics(await client.get_text(url, source.value, timeout))


async def read_load(client: Client, url: str, source: LoadSource = LoadSource.SGLANG) -> Load | None:
    """One server's load now (None: it did not answer in time, or not with a load)."""
    try:
        return await fetch_load(client, url, source, LOADS_TIMEOUT)
    except RequestError:
        return None


def watched(pool: ServerPool) -> list[tuple[ServerState, LoadSource]]:
    """The servers whose capacity follows their load reports, each with where it reports them."""
    return [(s, s.loads) for s in pool.servers if s.ceiling is not None and s.loads is not None]


async def watch_loads(pool: ServerPool, client: Client, share: int = 1, interval: float | None = None) -> None:
    """Poll the watched servers' loads and adjust their capacity, forever (the Runner cancels this task);
    `interval`: seconds between polls (None: LOADS_INTERVAL)."""
    interval = LOADS_INTERVAL if interval is None else interval
    servers = watched(pool)
    trends = {s.url: Trend() for s, _ in servers}
    while servers:
        now = pool.clock()
        live = [(s, source) for s, source in servers if not s.retired and now >= s.down_until]
        found = await asyncio.gather(*(read_load(client, s.url, source) for s, source in live))
        for (server, _), load in zip(live, found, strict=True):
            if load is not None and server.ceiling is not None:
                capacity, trends[server.url] = adjust(
                    server.capacity, server.ceiling, server.in_flight, load, trends[server.url], share
                )
                if capacity != server.capacity:
                    log.info("%s: capacity %d -> %d (its load report)", server.url, server.capacity, capacity)
                    server.set_capacity(capacity)
        await asyncio.sleep(interval)
