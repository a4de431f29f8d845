"""Prometheus metrics: /metrics during a simulated run with a dead and a flaky server, and the textfile."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from e2e import prompts
from prometheus_client.parser import text_string_to_metric_families

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.engine.metrics import RunCollector, worker_args, worker_file
from gen_pipeline.errors import ConfigError
from gen_pipeline.fleet.balancer import ServerPool
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.modes import run_async
from gen_pipeline.records import ALL_REASONS
from gen_pipeline.sim import SimConfig, free_ports, start_fleet

SERIES = (
    "gen_pipeline_rows_total",
    "gen_pipeline_input_rows",
    "gen_pipeline_rows_pending",
    "gen_pipeline_tokens_total",
    "gen_pipeline_requests_total",
    "gen_pipeline_server_in_flight",
    "gen_pipeline_server_up",
    "gen_pipeline_request_seconds_bucket",
    "gen_pipeline_request_seconds_count",
    "gen_pipeline_request_seconds_sum",
    "gen_pipeline_token_drift_rows_total",
    "gen_pipeline_client_cpu_seconds_total",
    "gen_pipeline_eta_seconds",
)


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"worker": "0", **labels}.items())))]


def total(parts: list[dict[Any, float]], name: str, **labels: str) -> float:
    """One series summed over several expositions and over the labels not given (`sum without (worker)`)."""
    return sum(
        v for samples in parts for (n, key), v in samples.items() if n == name and labels.items() <= dict(key).items()
    )


async def _scrape(session: aiohttp.ClientSession, port: int) -> dict[Any, float]:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        return parse(await response.text())


async def _run_and_scrape(tmp_path: Path, n: int) -> tuple[list[dict[Any, float]], dict[Any, float], Any, list[int]]:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(n)))
    ports = free_ports(4)
    sim = SimConfig(ports=tuple(ports), health_delay=0.0, token_latency=0.01, dead=(ports[0],), flaky={ports[1]: 0.3})
    metrics_port = free_ports(1)[0]
    async with await start_fleet(sim) as fleet:
        cfg = RunConfig(
            input=inp,
            out=tmp_path / "out",
            servers=tuple(f"http://user:secret@127.0.0.1:{p}" for p in ports),
            retry=RetryPolicy.testing(),
            progress="off",
            max_tokens=32,
            concurrency=4,
            metrics_port=metrics_port,
            metrics_host="127.0.0.1",
        )
        run = asyncio.create_task(run_async(cfg))
        mid: list[dict[Any, float]] = []
        async with aiohttp.ClientSession() as session:
            while True:
                await asyncio.sleep(0.05)
                try:
                    samples = await _scrape(session, metrics_port)
                except aiohttp.ClientConnectionError:
                    assert not run.done(), run.result()
                    continue
                done = value(samples, "gen_pipeline_rows_total", outcome="completed")
                if 0 < done < n:
                    mid.append(samples)
                if done == n:
                    break
            final = await _scrape(session, metrics_port)
        outcome = await run
        del fleet
    return mid, final, outcome, ports


@pytest.mark.slow
def test_metrics_port_serves_each_series_with_a_dead_and_a_flaky_server(tmp_path: Path) -> None:
    """Mid-run and at the end every series is there, the dead server is down, the figures are the summary's,
    and no label carries the URL's password or the API key."""
    n = 60
    mid, final, outcome, ports = asyncio.run(asyncio.wait_for(_run_and_scrape(tmp_path, n), 120))
    assert mid, "never scraped mid-run"
    for samples in (mid[-1], final):
        names = {name for name, _ in samples}
        assert set(SERIES) <= names, set(SERIES) - names
    dead, flaky = (f"http://127.0.0.1:{p}" for p in ports[:2])
    assert value(mid[-1], "gen_pipeline_server_up", server=dead) == 0
    assert value(final, "gen_pipeline_server_up", server=dead) == 0
    summary = outcome.summary
    assert value(final, "gen_pipeline_rows_total", outcome="completed") == summary["completed"] == n
    assert value(final, "gen_pipeline_tokens_total", kind="completion") == summary["output_tokens"]
    assert value(final, "gen_pipeline_tokens_total", kind="prompt") == summary["input_tokens"]
    assert value(final, "gen_pipeline_input_rows") == n
    assert value(final, "gen_pipeline_rows_pending") == 0
    view = summary["servers"][f"http://127.0.0.1:{ports[1]}"]
    assert value(final, "gen_pipeline_requests_total", server=flaky, status="ok") == view["completions"]
    assert value(final, "gen_pipeline_requests_total", server=flaky, status="server_error") == view["failures"].get(
        "server_error", 0
    )
    assert value(final, "gen_pipeline_request_seconds_count") == summary["requests"]
    labels = {v for key in final for _, v in key[1]}
    assert not any("secret" in label.lower() or "user@" in label for label in labels), labels


def test_server_labels_are_the_servers_names_without_credentials(tmp_path: Path) -> None:
    """A label keeps scheme, host, port and path: never a user or password (the config names servers without
    them), and a query token never gets that far (a server URL with a query is refused)."""
    cfg = RunConfig(input=tmp_path / "in", out=tmp_path / "o", servers="https://u:p@gpu1:30000/v1,http://[::1]:8000")
    pool = ServerPool(ServerState(url, 4) for url in cfg.servers)
    labels = {s.labels["server"] for family in RunCollector(None, pool, "0")._servers() for s in family.samples}
    assert labels == {"https://gpu1:30000/v1", "http://[::1]:8000"}
    with pytest.raises(ConfigError, match="no query") as info:
        RunConfig(input=tmp_path / "in", out=tmp_path / "o", servers="https://u:p@gpu1:30000/v1?token=x#f")
    assert "token=x" not in str(info.value) and ":p@" not in str(info.value)


def test_each_worker_gets_its_own_port_file_and_label(tmp_path: Path) -> None:
    """--workers K: claimer i serves P+i, writes PATH with .i, and labels its series worker=i."""
    cfg = RunConfig(input=tmp_path / "in", out=tmp_path / "o", metrics_port=9100, metrics_file=tmp_path / "g.prom")
    assert worker_args(cfg, 2) == [
        "--metrics-worker",
        "2",
        "--metrics-port",
        "9102",
        "--metrics-file",
        str(tmp_path / "g.2.prom"),
    ]
    assert worker_file(Path("/x/run.prom"), 0) == Path("/x/run.0.prom")


def test_metrics_file_holds_the_final_figures(tmp_path: Path) -> None:
    """--metrics-file: the textfile parses and, after the run, says what summary.json says."""
    from e2e import run_sim

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(20)))
    path = tmp_path / "textfile" / "gen.prom"
    path.parent.mkdir()
    outcome, _ = run_sim(inp, tmp_path / "out", {"n_ports": 2}, metrics_file=path)
    samples = parse(path.read_text())
    assert value(samples, "gen_pipeline_rows_total", outcome="completed") == outcome.summary["completed"] == 20
    assert value(samples, "gen_pipeline_tokens_total", kind="completion") == outcome.summary["output_tokens"]
    assert [p.name for p in path.parent.iterdir()] == ["gen.prom"]  # no temporary file left


@pytest.mark.slow
def test_workers_each_write_their_own_labelled_file_and_they_add_up(tmp_path: Path) -> None:
    """--workers 2 --metrics-file PATH: gen.0.prom and gen.1.prom, labelled worker 0 and 1, whose sums are
    the merged summary's (what `sum without (worker)` gives Prometheus)."""
    import procs

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(80)))
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    with procs.sim_fleet(2) as servers:
        args = ("--workers", "2", "--max-tokens", "16", "--metrics-file", str(textfiles / "gen.prom"))
        done = procs.run_generate(inp, tmp_path / "out", servers, *args)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert sorted(p.name for p in textfiles.iterdir()) == ["gen.0.prom", "gen.1.prom"]
    parts = [parse((textfiles / f"gen.{i}.prom").read_text()) for i in range(2)]
    for i, samples in enumerate(parts):
        assert {dict(labels)["worker"] for _, labels in samples} == {str(i)}
    assert total(parts, "gen_pipeline_rows_total", outcome="completed") == summary["completed"] == 80
    assert total(parts, "gen_pipeline_tokens_total", kind="completion") == summary["output_tokens"]


def _keep_scraping(port: int, stop: threading.Event, seen: list[tuple[float, dict[Any, float]]]) -> None:
    """GET /metrics on `port` every 0.1 s until `stop`: each answer, parsed, with when it was asked for."""
    while not stop.is_set():
        asked = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                seen.append((asked, parse(response.read().decode())))
        except OSError:
            pass  # not listening yet, or any more
        stop.wait(0.1)


@pytest.mark.slow
def test_workers_each_serve_their_own_labelled_port_and_they_add_up(tmp_path: Path) -> None:
    """--workers 2 --metrics-port P: claimer i serves P+i mid-run, every series labelled worker i; each
    port's last answer (it stays up after its claimer's run until scraped once more) holds that claimer's
    final figures, its --metrics-file's, and the two add up to the merged summary.json."""
    import procs

    n = 160
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(n)))
    port, textfile = procs.free_port_run(2), tmp_path / "gen.prom"
    stop = threading.Event()
    seen: list[list[tuple[float, dict[Any, float]]]] = [[], []]
    scrapers = [threading.Thread(target=_keep_scraping, args=(port + i, stop, seen[i])) for i in range(2)]
    with procs.sim_fleet(2, "--token-latency", "0.02") as servers:
        args = ("--workers", "2", "--max-tokens", "32", "--concurrency", "6", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1", "--metrics-file", str(textfile))  # fmt: skip
        for scraper in scrapers:
            scraper.start()
        try:
            done = procs.run_generate(inp, tmp_path / "out", servers, *args)
        finally:
            stop.set()
            for scraper in scrapers:
                scraper.join(30)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    counters = ("gen_pipeline_rows_total", "gen_pipeline_tokens_total", "gen_pipeline_request_seconds_count")
    spans = []
    for i, answers in enumerate(seen):
        assert answers, f"port {port + i} never answered"
        assert {dict(labels)["worker"] for _, samples in answers for _, labels in samples} == {str(i)}
        mid = [t for t, s in answers if value(s, "gen_pipeline_rows_total", worker=str(i), outcome="completed") > 0
               and value(s, "gen_pipeline_rows_pending", worker=str(i)) > 0]  # fmt: skip
        assert mid, f"port {port + i} was never scraped mid-run"
        spans.append((mid[0], mid[-1]))
        final = parse(worker_file(textfile, i).read_text())
        assert {k: v for k, v in answers[-1][1].items() if k[0] in counters} == {
            k: v for k, v in final.items() if k[0] in counters
        }, f"port {port + i}'s last answer is not its claimer's final figures"
    assert max(start for start, _ in spans) <= min(end for _, end in spans), spans  # both served at once
    both = [answers[-1][1] for answers in seen]
    assert total(both, "gen_pipeline_rows_total", outcome="completed") == summary["completed"] == n
    for reason in sorted(ALL_REASONS):
        assert total(both, "gen_pipeline_rows_total", outcome=reason) == summary["failed"].get(reason, 0)
    assert total(both, "gen_pipeline_tokens_total", kind="completion") == summary["output_tokens"]
    assert total(both, "gen_pipeline_tokens_total", kind="prompt") == summary["input_tokens"]
    assert total(both, "gen_pipeline_request_seconds_count") == summary["requests"]


def test_after_the_run_metrics_wait_only_for_a_scraper_that_is_there(tmp_path: Path) -> None:
    """Nobody scraped: no wait at the end. A scraper every second: about two intervals. Slow ones: at most 15 s."""
    from gen_pipeline.engine.metrics import Exporter
    from gen_pipeline.progress.stats import RunStats

    cfg = RunConfig(input=tmp_path / "in", out=tmp_path / "o", metrics_port=9100)
    exporter = Exporter(cfg, RunStats(), None)
    assert exporter.linger_s() == 0.0
    exporter.scrapes = [10.0, 11.0]
    assert exporter.linger_s() == 3.0
    exporter.scrapes = [10.0, 70.0]
    assert exporter.linger_s() == 15.0
    exporter.linger = 0.0  # interrupted
    assert exporter.linger_s() == 0.0


def test_a_taken_metrics_port_stops_the_run_in_one_line(tmp_path: Path) -> None:
    """--metrics-port on a port in use: exit 1 with a line naming the flag, before any request is sent."""
    import socket

    import procs

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(5)))
    with socket.socket() as taken, procs.sim_fleet(1) as servers:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = procs.run_generate(
            inp, tmp_path / "out", servers, "--metrics-port", str(port), "--metrics-host", "127.0.0.1"
        )
    assert done.returncode == 1, done.stderr
    assert f"error: --metrics-port {port}: cannot listen" in done.stderr
    assert "Traceback" not in done.stderr
    assert (
        not (tmp_path / "out" / "completions.jsonl").exists()
        or not (tmp_path / "out" / "completions.jsonl").read_bytes()
    )
