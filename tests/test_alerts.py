"""Alerts judged on a clock the test moves: stalls (and --on-stall once per stall), idle servers, a share far
below capacity, drift appearing mid-run, collapsed cache hits; status shows them. And `generate --on-stall`
end to end, against a simulator paused twice."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline.engine.summary import merge_statuses
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.progress.alerts import CPU, IDLE_S, Watch, progress_text, run_command
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


def _hook_runs(hooks: Path) -> list[tuple[float, dict[str, str]]]:
    """Each run of the --on-stall hook below: when it began, and its environment."""
    runs = []
    for path in sorted(hooks.glob("*.env")):
        began, *lines = path.read_text().splitlines()
        runs.append((float(began), dict(line.split("=", 1) for line in lines if "=" in line)))
    return sorted(runs, key=lambda run: run[0])


def _status_alerts(out: Path) -> list[str]:
    try:
        return list(orjson.loads((out / "status.json").read_bytes())["alerts"])
    except FileNotFoundError:
        return []


def _until(what: str, condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


@pytest.mark.slow
def test_generate_runs_the_stall_command_once_per_stall_without_the_api_key(tmp_path: Path) -> None:
    """`generate --stall-minutes 0.05 --on-stall CMD` against a simulator paused twice (SIGSTOP) for longer than
    that: CMD runs once in each pause and never outside one, with the alert and the run directory and without
    $GEN_PIPELINE_API_KEY; status.json shows the stall while it lasts and drops it once rows complete again."""
    import procs
    from e2e import prompts

    inp, out, hooks = tmp_path / "in.jsonl", tmp_path / "out", tmp_path / "hooks"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(120)))
    hooks.mkdir()
    hook = f'f={hooks}/$$; {{ date +%s.%N; env; }} > "$f.tmp" && mv "$f.tmp" "$f.env"'
    secret = "sk-stall-test-s3cr3t"
    args = ["--max-tokens", "16", "--concurrency", "4", "--stall-minutes", "0.05", "--on-stall", hook]
    pauses: list[tuple[float, float]] = []
    with procs.sim_fleet_process(2, "--token-latency", "0.02") as (servers, sim):
        argv = procs.generate_argv(inp, out, servers, *args, progress="off")
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**procs.env(), "GEN_PIPELINE_API_KEY": secret})  # fmt: skip
        try:
            done = 5
            for stall in (1, 2):
                procs.wait_for_lines(out / "completions.jsonl", done, timeout=60)
                assert run.poll() is None, run.communicate()
                assert (out / "completions.jsonl").read_bytes().count(b"\n") >= done
                sim.send_signal(signal.SIGSTOP)
                paused = time.time()
                _until(f"stall {stall}'s command", lambda: len(_hook_runs(hooks)) >= stall)  # noqa: B023
                _until("the alert in status.json", lambda: any(a.startswith("stalled: ") for a in _status_alerts(out)))
                time.sleep(3.0)  # six more looks of the monitor at a stall that goes on
                ran = len(_hook_runs(hooks))
                assert ran == stall
                sim.send_signal(signal.SIGCONT)
                pauses.append((paused, time.time()))
                done = (out / "completions.jsonl").read_bytes().count(b"\n") + 5
                _until("the alert to clear", lambda: not any(a.startswith("stalled") for a in _status_alerts(out)))
            _, stderr = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
    assert run.returncode == 0, stderr
    assert stderr.count("ALERT stalled: no completion for") == 2, stderr
    # (the hook's environment is the test runner's: assertions name variables, never print their values)
    runs = _hook_runs(hooks)
    assert len(runs) == 2, [began for began, _ in runs]
    assert [paused < began < resumed for (began, _), (paused, resumed) in zip(runs, pauses, strict=True)] == [True] * 2
    for _, env in runs:
        assert env["GEN_PIPELINE_ALERT"].startswith("stalled: no completion for "), env["GEN_PIPELINE_ALERT"]
        assert env["GEN_PIPELINE_OUT"] == str(out)
        leaked = sorted(name for name, value in env.items() if name == "GEN_PIPELINE_API_KEY" or secret in value)
        assert leaked == []
    assert orjson.loads((out / "summary.json").read_bytes())["completed"] == 120


@pytest.mark.slow  # a run of ~15 s with a paused fleet
def test_workers_run_the_stall_command_once_per_stall(tmp_path: Path) -> None:
    """`--workers 2`: both claimers see the shared fleet stall, and the command runs once (it ran once in each
    claimer, so a user's pager went off twice)."""
    import procs
    from e2e import prompts

    inp, out, hooks = tmp_path / "in.jsonl", tmp_path / "out", tmp_path / "hooks"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(80)))
    hooks.mkdir()
    hook = f'f={hooks}/$$; {{ date +%s.%N; env; }} > "$f.tmp" && mv "$f.tmp" "$f.env"'
    args = ["--max-tokens", "16", "--concurrency", "4", "--stall-minutes", "0.05", "--on-stall", hook, "--workers", "2"]
    with procs.sim_fleet_process(2, "--token-latency", "0.02") as (servers, sim):
        argv = procs.generate_argv(inp, out, servers, *args, progress="off")
        run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=procs.env())
        try:
            procs.wait_for_done(out, 5, timeout=60)
            sim.send_signal(signal.SIGSTOP)
            _until("the stall's command", lambda: len(_hook_runs(hooks)) >= 1)
            time.sleep(6.0)  # long enough for every claimer to see the stall (each looks every 0.5 s)
            sim.send_signal(signal.SIGCONT)
            _, stderr = run.communicate(timeout=120)
        finally:
            sim.send_signal(signal.SIGCONT)
            if run.poll() is None:
                run.kill()
                run.communicate()
    assert run.returncode == 0, stderr
    ran = len(_hook_runs(hooks))  # a count: the hook's environment is the test runner's, never printed
    assert ran == 1


class FakeCPU:
    """The Python threads' CPU seconds, run and waited for, moved by the test."""

    def __init__(self) -> None:
        self.s = 0.0
        self.waited = 0.0

    def __call__(self) -> CPU:
        return CPU(self.s, self.waited)


def test_a_client_at_its_cpu_limit_is_flagged_and_warned_of_at_the_end() -> None:
    """95% of a core for a minute is the CPU limit (an alert while it holds, the time added up for the end-of-run
    warning); 50% is not; the tail is never judged."""
    cpu = FakeCPU()
    watch, stats, servers = Watch(stall_s=1e9, cpu=cpu), _stats(), [ServerState("http://a:1", 8)]
    alerts: list[str] = []
    for t in range(0, 65, 5):
        alerts = watch.check(stats, servers, float(t))
        cpu.s += 0.95 * 5
    assert alerts == [
        "the client is at its CPU limit (95% of a core over 1m 00s): it, not the servers, sets the pace; "
        "more --workers processes share the run"
    ]
    assert watch.limited_s == 60.0
    assert watch.cpu_warnings(600.0) == [
        "the client was at its CPU limit (at least 90% of a core) for 1m 00s of the run's 10m 00s: there it, not "
        "the servers, set the pace; more --workers processes share a run"
    ]
    assert watch.cpu_warnings(601.0) == []  # under a tenth of the run
    for t in range(65, 400, 5):
        alerts = watch.check(stats, servers, float(t))
        cpu.s += 0.5 * 5
    assert alerts == []
    assert watch.limited_s == 65.0  # the first half-busy stretch still counts: its start was busy
    for t in range(400, 500, 5):
        alerts = watch.check(stats, servers, float(t), tail=True)
        cpu.s += 5
    assert alerts == []
    assert watch.limited_s == 65.0


def test_a_busy_client_for_under_a_minute_is_not_warned_of() -> None:
    """A short run that was busy from end to end: no end-of-run warning under LIMITED_WARN_S."""
    cpu = FakeCPU()
    watch, stats, servers = Watch(stall_s=1e9, cpu=cpu), _stats(), [ServerState("http://a:1", 8)]
    for t in range(0, 55, 5):
        watch.check(stats, servers, float(t))
        cpu.s += 5
    assert watch.limited_s == 50.0
    assert watch.cpu_warnings(50.0) == []


def test_a_client_short_of_a_cpu_is_flagged_and_warned_of_at_the_end() -> None:
    """Ran 55% and waited for a CPU 40% of the time: short of a CPU (other work holds the cores), not at its
    limit; waiting 10% (runnable 65%) is neither."""
    cpu = FakeCPU()
    watch, stats, servers = Watch(stall_s=1e9, cpu=cpu), _stats(), [ServerState("http://a:1", 8)]
    alerts: list[str] = []
    for t in range(0, 125, 5):
        alerts = watch.check(stats, servers, float(t))
        cpu.s, cpu.waited = cpu.s + 0.55 * 5, cpu.waited + 0.4 * 5
    assert alerts == [
        "the client is short of a CPU (over 2m 00s it waited for one 40% of the time and ran 55%): other work on "
        "this machine holds the cores it needs, and it, not the servers, sets the pace"
    ]
    assert (watch.limited_s, watch.starved_s) == (0.0, 120.0)
    assert watch.cpu_warnings(1200.0) == [
        "the client was short of a CPU for 2m 00s of the run's 20m 00s (other work on the machine held the cores "
        "it needed): there it, not the servers, set the pace"
    ]
    quiet = Watch(stall_s=1e9, cpu=(cpu := FakeCPU()))
    for t in range(0, 125, 5):
        alerts = quiet.check(stats, servers, float(t))
        cpu.s, cpu.waited = cpu.s + 0.55 * 5, cpu.waited + 0.1 * 5
    assert alerts == [] and quiet.starved_s == 0.0


def test_the_cpu_limit_warning_ends_up_in_the_summary(tmp_path: Path, monkeypatch: Any) -> None:
    """summary.json's warnings carry what the run's Watch says of its CPU limit, given the run's length."""
    from e2e import prompts, run_sim

    monkeypatch.setattr(Watch, "cpu_warnings", lambda self, span_s: [f"limited, over a run of {span_s > 0} s"])
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(5)))
    outcome, _ = run_sim(inp, tmp_path / "out", {"n_ports": 1})
    assert "limited, over a run of True s" in outcome.summary["warnings"]
    assert "limited, over a run of True s" in orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["warnings"]


def test_the_cpu_judged_is_that_of_every_python_thread() -> None:
    """Another thread's CPU counts, read from the thread that asks (the monitor runs on the event loop's; counting
    has its own)."""
    import threading

    from gen_pipeline.progress.alerts import python_cpu

    spun, done = threading.Event(), threading.Event()

    def spin() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        spun.set()
        done.wait(30)  # alive while the test reads its clock

    before = python_cpu().ran
    worker = threading.Thread(target=spin)
    worker.start()
    assert spun.wait(30)
    grown = python_cpu().ran - before
    done.set()
    worker.join(30)
    assert grown >= 0.3
