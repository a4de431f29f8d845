"""Prometheus metrics of a running `generate`: --metrics-port serves /metrics, --metrics-file writes the
node_exporter textfile format.

Nothing is counted twice: one collector reads, at scrape time, the figures the run keeps anyway (its
RunStats and its ServerPool), so the metrics always agree with status.json and summary.json. Each process
builds its own registry; every series carries a `worker` label (0 for a single process, i for the claimer
i of `--workers K`, which serves port P+i and writes its own file), so that `sum without (worker, instance)`
adds up a node and a fleet of nodes. Counters count what this process did: they start at 0 on a resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import ConfigError
from ..records import ALL_REASONS

FILE_INTERVAL = 2.0  # seconds between --metrics-file rewrites
# After the run, a /metrics that has been scraped stays up until scraped once more (its final figures): at
# most two of the intervals seen between scrapes, and never more than this long.
LINGER_S = 15.0
TOKEN_KINDS = ("prompt", "completion", "cached", "rejected")  # rejected: of completion, what rejected answers cost


def worker_file(path: Path, worker: int) -> Path:
    """Claimer `worker`'s own --metrics-file under --workers K: run.prom -> run.1.prom."""
    return path.with_name(f"{path.stem}.{worker}{path.suffix}")


def worker_args(config: RunConfig, worker: int) -> list[str]:
    """The metrics flags of claimer `worker` of `--workers K`: its own port and file, and its label."""
    args = ["--metrics-worker", str(worker)]
    if config.metrics_port is not None:
        args += ["--metrics-port", str(config.metrics_port + worker)]
    if config.metrics_file is not None:
        args += ["--metrics-file", str(worker_file(config.metrics_file, worker))]
    return args


class RunCollector:
    """The run's series, read from its RunStats and ServerPool at each collect()."""

    def __init__(self, stats: Any, pool: Any, worker: str) -> None:
        self.stats, self.pool, self.worker = stats, pool, worker

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats, w = self.stats, [self.worker]
        rows = CounterMetricFamily(
            "gen_pipeline_rows", "Rows settled by this process, by outcome", labels=["worker", "outcome"]
        )
        rows.add_metric([*w, "completed"], stats.completed)
        for reason in sorted(ALL_REASONS):
            rows.add_metric([*w, reason], stats.failed.get(reason, 0))
        tokens = CounterMetricFamily("gen_pipeline_tokens", "Tokens by kind", labels=["worker", "kind"])
        counts = (stats.input_tokens, stats.output_tokens, stats.cached_tokens, stats.rejected_tokens)
        for kind, count in zip(TOKEN_KINDS, counts, strict=True):
            tokens.add_metric([*w, kind], count)
        drift = CounterMetricFamily(
            "gen_pipeline_token_drift_rows", "Rows whose server prompt count differed from ours", labels=["worker"]
        )
        drift.add_metric(w, stats.drift_view()["differed"])
        cpu = CounterMetricFamily(
            "gen_pipeline_client_cpu_seconds",
            "CPU seconds this process used, all its threads (its Python threads share one core)",
            labels=["worker"],
        )
        cpu.add_metric(w, round(time.process_time(), 3))
        yield from (rows, tokens, drift, cpu, *self._answers(), *self._gauges(GaugeMetricFamily), *self._servers())
        yield self._histogram()

    def _answers(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        stats, w = self.stats, [self.worker]
        judged = CounterMetricFamily("gen_pipeline_answers", "Answers judged by the answer checks", labels=["worker"])
        judged.add_metric(w, stats.answers)
        rejected = CounterMetricFamily(
            "gen_pipeline_rejected_answers", "Answers rejected (kept in rejected.jsonl, resampled), by reason and "
            "check", labels=["worker", "reason", "check"],
        )  # fmt: skip
        for (reason, check), n in sorted(stats.rejects.items()):
            rejected.add_metric([*w, reason, check], n)
        yield from (judged, rejected)

    def _gauges(self, family: Any) -> Iterator[Any]:
        stats, w = self.stats, [self.worker]
        left, eta = stats.unsettled(), stats.eta()
        total = stats.handed_over / stats.input_fraction if stats.input_fraction > 0 else None
        for name, text, value in (
            ("gen_pipeline_input_rows", "Rows of the input this process reads (estimated until read)", total),
            ("gen_pipeline_rows_pending", "Rows not settled yet (NaN before the input is read)", left),
            ("gen_pipeline_eta_seconds", "Seconds left at the recent rate (NaN when unknown)", eta),
        ):
            gauge = family(name, text, labels=["worker"])
            gauge.add_metric(w, math.nan if value is None else round(value, 1))
            yield gauge

    def _servers(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = self.pool.clock()
        labels = ["worker", "server"]
        requests = CounterMetricFamily(
            "gen_pipeline_requests", "Requests by server and outcome (ok, or the failure's ledger reason)",
            labels=[*labels, "status"],
        )  # fmt: skip
        flight = GaugeMetricFamily("gen_pipeline_server_in_flight", "Requests in flight", labels=labels)
        up = GaugeMetricFamily(
            "gen_pipeline_server_up", "1 while the server takes requests, 0 while out", labels=labels
        )
        for s in self.pool.servers:
            key = [self.worker, s.url]  # the server's name: RunConfig took its credentials off
            requests.add_metric([*key, "ok"], s.completions - sum(s.rejects.values()))
            for reason, n in sorted(s.rejects.items()):  # answered, but the answer was rejected
                requests.add_metric([*key, reason], n)
            for reason, n in sorted(s.failures.items()):
                requests.add_metric([*key, reason], n)
            flight.add_metric(key, s.in_flight)
            up.add_metric(key, 1 if now >= s.down_until else 0)
        yield from (requests, flight, up)

    def _histogram(self) -> Any:
        from prometheus_client.core import HistogramMetricFamily

        stats = self.stats
        buckets = [(_le(b), n) for b, n in stats.latency.cumulative()]
        hist = HistogramMetricFamily(
            "gen_pipeline_request_seconds", "Seconds per request to a server (every attempt)", labels=["worker"]
        )
        hist.add_metric([self.worker], buckets, sum_value=stats.latency.total_s)
        return hist


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class Exporter:
    """One process's registry, its /metrics server and its textfile."""

    def __init__(self, config: RunConfig, stats: Any, pool: Any) -> None:
        from prometheus_client import CollectorRegistry

        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunCollector(stats, pool, config.metrics_worker))
        self.scrapes: list[float] = []  # when /metrics was read (the last two)
        self.scraped = asyncio.Event()
        self.runner: Any = None
        self.linger = LINGER_S  # the run sets 0 when interrupted: a Ctrl-C does not wait for a scrape

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST

        body = self.exposition()
        self.scrapes = [*self.scrapes[-1:], time.monotonic()]
        self.scraped.set()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        """Serve /metrics on --metrics-port (when given)."""
        from aiohttp import web

        if self.config.metrics_port is None:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.metrics_host, self.config.metrics_port)
        try:
            await site.start()
        except OSError as exc:  # the port is taken, or the host is not this machine's
            await self.runner.cleanup()
            self.runner = None
            raise ConfigError(
                f"--metrics-port {self.config.metrics_port}: cannot listen: {exc.strerror or exc}"
            ) from exc

    def write_file(self) -> None:
        """Replace --metrics-file in one step (write_to_textfile writes a temporary file and renames it)."""
        from prometheus_client import write_to_textfile

        if self.config.metrics_file is not None:
            with contextlib.suppress(OSError):  # a metrics file never stops a run
                write_to_textfile(str(self.config.metrics_file), self.registry)

    async def keep_writing(self) -> None:
        while True:
            self.write_file()
            await asyncio.sleep(FILE_INTERVAL)

    async def close(self) -> None:
        """The final figures: written to the file, and served until scraped once more (or `linger` s)."""
        self.write_file()
        if self.runner is None:
            return
        self.scraped.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.scraped.wait(), self.linger_s())
        await self.runner.cleanup()

    def linger_s(self) -> float:
        """How long to wait for the scrape that reads the final figures (0 when nobody has scraped)."""
        if not self.scrapes:
            return 0.0
        interval = self.scrapes[-1] - self.scrapes[0] if len(self.scrapes) > 1 else self.linger
        return min(2 * interval + 1.0, self.linger)


@contextlib.asynccontextmanager
async def exporting(config: RunConfig, stats: Any, pool: Any) -> AsyncIterator[Exporter | None]:
    """The run's metrics while the body runs (nothing, and no prometheus_client import, without the flags)."""
    if config.metrics_port is None and config.metrics_file is None:
        yield None
        return
    exporter = Exporter(config, stats, pool)
    await exporter.start()
    writer = asyncio.create_task(exporter.keep_writing())
    try:
        yield exporter
    except BaseException:
        exporter.linger = 0.0  # cancelled or failed: no one waits for the final figures
        raise
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await exporter.close()
