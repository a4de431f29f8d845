"""A real Prometheus (Debian's `prometheus` package; .ci/run installs it) scrapes a simulated-fleet run: the
series are there mid-run, and at the end Prometheus holds the figures summary.json has."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
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
    "gen_pipeline_eta_seconds",
}


def _query(api: str, expr: str) -> list[dict[str, Any]]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        doc = json.loads(response.read())
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


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
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
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
    """Mid-run Prometheus has every series with a partial count; at the end its figures are summary.json's."""
    api, port = prometheus
    n = 240
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(n)))
    out = tmp_path / "out"
    with procs.sim_fleet(3, "--token-latency", "0.02", "--p500", "0.05") as servers:
        args = ("--max-tokens", "32", "--concurrency", "4", "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
        proc = procs.generate(inp, out, servers, *args)
        mid: set[str] = set()
        partial = None
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                done = _last(api, 'gen_pipeline_rows_total{outcome="completed"}')
                if done is not None and 0 < done < n:
                    partial = done
                    mid = {r["metric"]["__name__"] for r in _query(api, '{__name__=~"gen_pipeline_.*"}')}
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode in (0, 3), stderr
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
