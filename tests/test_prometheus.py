"""A real Prometheus (Debian's `prometheus` package; .ci/run installs it) scrapes a simulated-fleet run: the
series are there mid-run with the counts status.json had around each scrape, and at the end Prometheus
holds the figures summary.json has."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import procs
import pytest
from e2e import prompts

from gen_pipeline.sim import free_ports

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="needs Debian's prometheus (apt-get install prometheus)"
    ),
]

SERIES = {
    "gen_pipeline_rows_total",
    "gen_pipeline_input_rows",
    "gen_pipeline_rows_pending",
    "gen_pipeline_tokens_total",
    "gen_pipeline_requests_total",
    "gen_pipeline_server_in_flight",
    "gen_pipeline_server_up",
    "gen_pipeline_request_seconds_bucket",
    "gen_pipeline_token_drift_rows_total",
    "gen_pipeline_client_cpu_seconds_total",
    "gen_pipeline_eta_seconds",
}


SCRAPE_TIMEOUT_S = 1.0


def _query(api: str, expr: str) -> list[dict[str, Any]]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        doc = json.loads(response.read())
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


@dataclass
class Scrape:
    """One scrape Prometheus stored mid-run: its timestamp (when the scrape began) and the rows it saw."""

    t: float
    rows: dict[str, float]  # gen_pipeline_rows_total by outcome
    pending: float
    input_rows: float


def _newest_scrape(api: str) -> Scrape | None:
    """The newest scrape that holds every rows series (each scrape stamps all its samples alike)."""
    names = "gen_pipeline_rows_total|gen_pipeline_rows_pending|gen_pipeline_input_rows"
    by_time: dict[float, dict[str, float]] = {}
    for series in _query(api, f'{{__name__=~"{names}"}}[1m]'):
        metric = series["metric"]
        key = metric.get("outcome", metric["__name__"])
        for t, v in series["values"]:
            by_time.setdefault(float(t), {})[key] = float(v)
    needed = {"completed", "gen_pipeline_rows_pending", "gen_pipeline_input_rows"}
    whole = [t for t, got in by_time.items() if needed <= got.keys()]
    if not whole:
        return None
    got = by_time[max(whole)]
    pending, total = got.pop("gen_pipeline_rows_pending"), got.pop("gen_pipeline_input_rows")
    return Scrape(max(whole), got, pending, total)


def _status(out: Path) -> dict[str, Any] | None:
    """status.json as the run last wrote it (it replaces the file in one step), None before the first."""
    try:
        return dict(orjson.loads((out / "status.json").read_bytes()))
    except FileNotFoundError:
        return None


def _counts(status: dict[str, Any]) -> dict[str, int]:
    """Rows settled by outcome in a status.json snapshot, as gen_pipeline_rows_total labels them."""
    return {"completed": status["counts"]["done"], **status["counts"]["failed"]}


MARGIN_S = 0.1  # Prometheus may move a scrape's timestamp by a few ms to line scrapes up


def _bracket(scrape: Scrape, snapshots: dict[float, dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]] | None:
    """The counts of the newest status.json written before the scrape began and of the first written once
    it must have been answered (within the scrape timeout; the final one is written after /metrics closed):
    counts only grow, so the scrape's lie between. None while that second snapshot is not written yet."""
    before = [t for t in snapshots if t <= scrape.t - MARGIN_S]
    after = [
        t for t, doc in snapshots.items() if t >= scrape.t + SCRAPE_TIMEOUT_S + MARGIN_S or doc["state"] == "finished"
    ]
    if not after:
        return None
    low = _counts(snapshots[max(before)]) if before else {}
    return low, _counts(snapshots[min(after)])


def _last(api: str, selector: str) -> float | None:
    """The newest sample of one series, also after its target went away (stale markers are skipped)."""
    result = _query(api, f"last_over_time({selector}[10m])")
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """Prometheus on 127.0.0.1 scraping a free port every second; yields its API URL and that port."""
    target, listen = free_ports(2)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: 1s\n  scrape_timeout: {SCRAPE_TIMEOUT_S:g}s\n"
        f"scrape_configs:\n  - job_name: gen\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
    )
    argv = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{listen}", "--log.level=warn"]  # fmt: skip
    log = tmp_path / "prometheus.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sink)
    api = f"http://127.0.0.1:{listen}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"{api}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield api, target
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_prometheus_scrapes_a_run_and_agrees_with_the_summary(tmp_path: Path, prometheus: tuple[str, int]) -> None:
    """Mid-run Prometheus has every series, and the counts of each scrape lie between those of the status.json
    snapshots written around it; at the end its figures are summary.json's."""
    api, port = prometheus
    n = 240
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(n)))
    out = tmp_path / "out"
    snapshots: dict[float, dict[str, Any]] = {}  # status.json by its `updated` (the wall clock, as Prometheus's)
    scrapes: dict[float, Scrape] = {}  # mid-run ones, by timestamp, until a later snapshot brackets them
    compared: list[tuple[Scrape, dict[str, int], dict[str, int]]] = []

    def compare() -> None:
        for t, scrape in list(scrapes.items()):
            if (bracket := _bracket(scrape, snapshots)) is not None:
                low, high = bracket
                for outcome, value in scrape.rows.items():
                    assert low.get(outcome, 0) <= value <= high.get(outcome, 0), (outcome, low, scrape, high)
                compared.append((scrape, low, high))
                del scrapes[t]

    with procs.sim_fleet(3, "--token-latency", "0.02", "--p500", "0.05") as servers:
        args = ("--max-tokens", "32", "--concurrency", "4", "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
        proc = procs.generate(inp, out, servers, *args)
        mid: set[str] = set()
        partial = None
        try:
            next_query = time.monotonic()
            while proc.poll() is None:
                time.sleep(0.2)
                if (doc := _status(out)) is not None:
                    snapshots[float(doc["updated"])] = doc
                compare()
                if time.monotonic() < next_query:
                    continue
                next_query = time.monotonic() + 1.0
                scrape = _newest_scrape(api)
                if scrape is not None and 0 < scrape.rows["completed"] < n:
                    partial = scrape.rows["completed"]
                    scrapes[scrape.t] = scrape
                    # the input is read whole in one batch: its rows are known, and each is settled or pending
                    assert scrape.input_rows == n, scrape
                    assert scrape.pending + sum(scrape.rows.values()) == n, scrape
                    mid = {r["metric"]["__name__"] for r in _query(api, '{__name__=~"gen_pipeline_.*"}')}
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode in (0, 3), stderr
    final = _status(out)
    assert final is not None and final["state"] == "finished", final
    snapshots[float(final["updated"])] = final
    compare()
    assert not scrapes, scrapes  # the final snapshot comes after every scrape
    assert sum(1 for _, low, _ in compared if low.get("completed", 0) > 0) >= 2, compared  # two scrapes bracketed
    assert partial is not None, "Prometheus never saw the run mid-way"
    assert mid >= SERIES, SERIES - mid
    summary = orjson.loads((out / "summary.json").read_bytes())
    deadline = time.monotonic() + 10  # the last scrape's samples are committed a moment after it is answered
    while _last(api, 'gen_pipeline_rows_total{outcome="completed"}') != summary["completed"]:
        assert time.monotonic() < deadline, "Prometheus never got the final figures"
        time.sleep(0.2)
    for reason, count in summary["failed"].items():
        assert _last(api, f'gen_pipeline_rows_total{{outcome="{reason}"}}') == count
    assert _last(api, 'gen_pipeline_tokens_total{kind="completion"}') == summary["output_tokens"]
    assert _last(api, 'gen_pipeline_tokens_total{kind="prompt"}') == summary["input_tokens"]
    assert _last(api, "gen_pipeline_request_seconds_count") == summary["requests"]
    assert _last(api, "gen_pipeline_rows_pending") == 0
    for url, view in summary["servers"].items():
        assert _last(api, f'gen_pipeline_requests_total{{server="{url}",status="ok"}}') == view["completions"]
    done = [float(v) for _, v in _query(api, 'gen_pipeline_rows_total{outcome="completed"}[10m]')[0]["values"]]
    assert done == sorted(done), done  # a counter: it never went back over the run
