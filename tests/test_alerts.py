"""Alerts judged on a clock the test moves: stalls (and --on-stall once per stall), idle servers, a share far
below capacity, drift appearing mid-run, collapsed cache hits; status shows them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gen_pipeline.engine.summary import merge_statuses
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.progress.alerts import IDLE_S, Watch, progress_text, run_command
from gen_pipeline.progress.stats import RunStats, snapshot
from gen_pipeline.views.statustext import render_status


def _stats() -> RunStats:
    return RunStats(clock=lambda: 0.0)


def test_a_stall_runs_the_command_once_per_stall(tmp_path: Path) -> None:
    """No completion for --stall-minutes is a stall; its command runs once, and again for the next stall."""
    started: list[subprocess.Popen[bytes]] = []

    def start(command: str, env: dict[str, str]) -> Any:
        started.append(run_command(command, env))
        return started[-1]

    log = tmp_path / "stalls.log"
    watch = Watch(stall_s=120, on_stall=f'echo "$GEN_PIPELINE_ALERT" >> {log}', out=str(tmp_path), start=start)
    stats, servers = _stats(), [ServerState("http://a:1", 8)]
    assert watch.check(stats, servers, 0.0) == []
    assert watch.check(stats, servers, 119.0) == []
    assert watch.check(stats, servers, 121.0) == ["stalled: no completion for 2m 01s"]
    assert watch.check(stats, servers, 300.0) == ["stalled: no completion for 5m 00s"]
    stats.completed += 1
    assert watch.check(stats, servers, 310.0) == []
    assert watch.check(stats, servers, 431.0) == ["stalled: no completion for 2m 01s"]
    for proc in started:
        assert proc.wait(30) == 0
    assert log.read_text().splitlines() == ["stalled: no completion for 2m 01s"] * 2


def test_a_server_without_requests_while_others_are_busy_is_flagged() -> None:
    """Idle for IDLE_S while another server has requests in flight; not when the whole fleet is idle."""
    idle, busy = ServerState("http://idle:1", 8), ServerState("http://busy:2", 8)
    watch, stats = Watch(stall_s=1e9), _stats()
    watch.check(stats, [idle, busy], 0.0)
    busy.last_sent = IDLE_S + 5
    assert watch.check(stats, [idle, busy], IDLE_S + 5) == []  # nobody busy: a quiet fleet, not a lost server
    busy.in_flight = 3
    assert watch.check(stats, [idle, busy], IDLE_S + 6) == [
        "http://idle:1 got no request for 10m 06s while others were busy"
    ]


def test_a_share_far_below_capacity_is_flagged() -> None:
    """A server whose slots stay nearly empty while the fleet's are busy, over the recent window."""
    full, empty = ServerState("http://full:1", 8, in_flight=8), ServerState("http://empty:2", 8, in_flight=1)
    watch, stats = Watch(stall_s=1e9), _stats()
    alerts = []
    for t in range(0, 70, 5):
        full.last_sent = empty.last_sent = float(t)
        alerts = watch.check(stats, [full, empty], float(t))
    assert alerts == ["http://empty:2 is 12% busy while the fleet is 56%: its share is far below its capacity"]
    assert watch.check(stats, [full, empty], 70.0, tail=True) == []  # the balancer's tail leaves it idle
    empty.in_flight = 6
    for t in range(70, 500, 5):
        full.last_sent = empty.last_sent = float(t)
        alerts = watch.check(stats, [full, empty], float(t))
    assert alerts == []


def test_drift_appearing_mid_run_is_flagged_but_not_drift_from_the_start() -> None:
    """Rows agreed with the servers' counts, then some differed: flagged. Differing from the first rows: not."""
    watch, stats, servers = Watch(stall_s=1e9), _stats(), [ServerState("http://a:1", 8)]
    stats.drift[0] = 40
    assert watch.check(stats, servers, 0.0) == []
    stats.drift[3] = 2
    assert watch.check(stats, servers, 1.0) == [
        "token-count drift appeared mid-run: 2 rows differed after 40 that agreed"
    ]
    early, stats = Watch(stall_s=1e9), _stats()
    stats.drift.update({0: 5, 3: 2})
    assert early.check(stats, servers, 0.0) == []


def test_collapsed_cache_hits_are_flagged() -> None:
    """Half the prompt tokens came from the prefix cache, then none did."""
    watch, stats, servers = Watch(stall_s=1e9), _stats(), [ServerState("http://a:1", 8)]
    stats.cached_tokens, stats.input_tokens = 500, 1000
    alerts = []
    for t in range(0, 70, 5):
        alerts = watch.check(stats, servers, float(t))
        stats.input_tokens += 100
    assert alerts == ["prefix-cache hits collapsed: 0% of prompt tokens lately, 50% before"]


def test_status_shows_the_alerts_of_every_worker() -> None:
    """status.json carries the alerts; the merge of workers keeps each; status prints them."""
    stats, servers = _stats(), [ServerState("http://a:1", 8)]
    one = snapshot(stats, servers, "running", 0.0, ["stalled: no completion for 12 min"])
    two = snapshot(stats, servers, "running", 0.0, ["http://a:1 got no request for 11 min while others were busy"])
    merged = merge_statuses([one, two], [one, two])
    text = render_status(merged)
    assert "ALERT: stalled: no completion for 12 min" in text
    assert "ALERT: http://a:1 got no request for 11 min while others were busy" in text


def test_the_progress_line_shows_the_first_alert_and_counts_the_rest() -> None:
    """One alert in full; more: the first and how many more `status` lists."""
    assert progress_text([]) == ""
    assert progress_text(["stalled: no completion for 10m 00s"]) == " | ALERT: stalled: no completion for 10m 00s"
    assert progress_text(["a", "b", "c"]) == " | ALERT: a (+2 more: gen-pipeline status)"


def test_the_stall_command_gets_no_server_secret(tmp_path: Path, monkeypatch: Any) -> None:
    """A `--workers` claimer holds the servers' credentials and API key in its environment: the --on-stall hook
    (a notifier) gets the run's environment without them, and its own variables."""
    monkeypatch.setenv("GEN_PIPELINE_SERVER_AUTH", '{"http://h:1": ["alice", "s3cr3t"]}')
    monkeypatch.setenv("GEN_PIPELINE_API_KEY", "sk-s3cr3t")
    monkeypatch.setenv("KEPT_FOR_THE_HOOK", "yes")
    seen = tmp_path / "env"
    proc = run_command(f"env > {seen}", {"GEN_PIPELINE_ALERT": "stalled"})
    assert proc.wait(timeout=30) == 0
    text = seen.read_text()
    assert "s3cr3t" not in text
    assert "KEPT_FOR_THE_HOOK=yes" in text and "GEN_PIPELINE_ALERT=stalled" in text
