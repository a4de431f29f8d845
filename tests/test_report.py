"""`gen-pipeline status` and `report` on real run directories: finished, running, crashed."""

from __future__ import annotations

import time

import orjson
import pytest
from e2e import prompts, run_sim

from gen_pipeline.cli import main
from gen_pipeline.engine.summary import write_status
from gen_pipeline.views import report as report_module
from gen_pipeline.views.plots import PLOTS, throughput_series
from gen_pipeline.views.rundata import distribution
from gen_pipeline.views.status import STALE_AFTER, STATUS, run_state
from gen_pipeline.views.statustext import render_status

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run directory that generate finished against the simulator."""
    tmp = tmp_path_factory.mktemp("run")
    path = tmp / "prompts.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(40)))
    outcome, _ = run_sim(path, tmp / "out", {"n_ports": 3, "context_length": 1024})
    assert outcome.exit_code == 0
    return tmp / "out"


def snapshot(updated: float, **kw) -> dict:
    """A status.json as the running pipeline writes it."""
    return {
        "updated": updated,
        "pid": 4242,
        "state": "running",
        "counts": {"done": 120, "skipped": 3, "failed": {"timeout": 2}, "in_flight": 16},
        "rates": {"req_per_s": 12.5, "out_tok_per_s": 4100.0},
        "eta_s": 3725,
        "servers": {
            "http://h:30000": {"in_flight": 16, "capacity": 64, "healthy": True, "requests": 90, "failures": {}},
            "http://h:30001": {
                "in_flight": 0,
                "capacity": 64,
                "healthy": False,
                "requests": 35,
                "failures": {"connection": 4},
            },
        },
        "last_error": {"connection": "http://h:30001: cannot connect"},
        **kw,
    }


def test_status_of_a_finished_run(finished_run, capsys):
    """A finished run shows its summary and exit code."""
    assert main(["status", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "exit code 0" in out and "completed 40" in out


def test_report_prints_the_table_and_writes_png_plots(finished_run, tmp_path, capsys):
    """The table names every server; every plot is a non-empty PNG."""
    assert main(["report", str(finished_run), "--out", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "completions 40 lines" in out and out.count("http://127.0.0.1:") >= 3
    for name in PLOTS:
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 1024, name


def test_report_without_matplotlib_prints_the_table_and_how_to_get_plots(finished_run, monkeypatch, capsys):
    """Without the optional extra the table still prints, plus the install hint."""
    monkeypatch.setattr(report_module, "has_matplotlib", lambda: False)
    assert main(["report", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert "finish      stop" in out and report_module.INSTALL_HINT in out


def test_status_of_a_crashed_run_says_not_running(finished_run, tmp_path, capsys):
    """A status.json older than STALE_AFTER with no newer summary: not running (exit 3), counts from the files."""
    run = tmp_path / "crashed"
    run.mkdir()
    for name in ("completions.jsonl", "failures.jsonl", "manifest.json"):
        (run / name).write_bytes((finished_run / name).read_bytes())
    write_status(run / STATUS, snapshot(time.time() - 95))
    assert main(["status", str(run)]) == 3  # not running: the run wants the same command again
    out = capsys.readouterr().out
    assert "not running (last update 1m 35s ago)" in out and "files: 40 completions" in out


def test_status_of_a_running_run(tmp_path, capsys):
    """A fresh status.json is shown as running, with servers and the last errors."""
    write_status(tmp_path / STATUS, snapshot(time.time()))
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run {tmp_path}") and "running (pid 4242)" in out and "ETA 1h 02m" in out


@pytest.mark.parametrize(
    ("status_age", "summary_age", "state"),
    [
        (2, None, "running"),
        (STALE_AFTER + 5, None, "not running"),
        (STALE_AFTER + 5, STALE_AFTER + 60, "not running"),  # the summary is an earlier run's
        (STALE_AFTER + 60, STALE_AFTER + 5, "finished"),
        (None, 10, "finished"),
        (None, None, "not running"),
    ],
)
def test_run_state_table(status_age, summary_age, state):
    """Running, finished or not running, from the ages of status.json and summary.json."""
    now = 1_000_000.0
    status = None if status_age is None else snapshot(now - status_age)
    summary_mtime = None if summary_age is None else now - summary_age
    assert run_state(status, summary_mtime, now) == state


def test_render_status_is_readable():
    """Counts, rates, ETA, every server and the last error each get a line."""
    text = render_status(snapshot(100.0), now=103.0)
    assert text.splitlines()[:4] == [
        "running (pid 4242), updated 3 s ago",
        "done 120 | skipped 3 | failed 2 {'timeout': 2} | in flight 16",
        "12.5 req/s | 4100.0 out tok/s | ETA 1h 02m",
        "servers: 1 of 2 healthy",
    ]
    assert "OUT OF SERVICE" in text and "last connection: http://h:30001: cannot connect" in text


def test_not_a_run_directory_is_an_error(tmp_path, capsys):
    """status and report refuse a directory that holds no run."""
    assert main(["status", str(tmp_path)]) == 1
    assert main(["report", str(tmp_path)]) == 1
    assert "is not a run directory" in capsys.readouterr().err


def test_distribution_uses_nearest_rank():
    """p50/p90/p99 are values of the data (nearest rank)."""
    assert distribution(list(range(1, 101))) == {"n": 100, "min": 1, "p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert distribution([]) == {"n": 0}


def test_throughput_buckets_add_up_to_the_elapsed_time():
    """Little's law: the estimated bucket durations sum to the run's elapsed time."""
    latency, tokens = [1.0] * 100, [50] * 100
    x, rate, mean_latency, _, _ = throughput_series(latency, tokens, in_flight=100 / 10.0, buckets=10)
    assert x[-1] == pytest.approx(10.0) and rate == pytest.approx([500.0] * 10)
    assert mean_latency == pytest.approx([1.0] * 10)


def test_progress_bar_shows_the_counts_and_log_mode_needs_no_tqdm(capsys):
    """The bar (tqdm, imported only for it) shows settled rows and the line; other modes never import tqdm."""
    import subprocess
    import sys

    from gen_pipeline.progress.display import Progress
    from gen_pipeline.progress.live import show
    from gen_pipeline.progress.stats import RunStats

    stats = RunStats(completed=3)
    stats.failed["bad_input"] = 1
    stats.work.total = 10  # the input's count (engine/workload.py)
    bar = Progress("bar")
    show(bar, stats)
    bar.close()
    err = capsys.readouterr().err
    assert "4/10" in err and "done 3" in err and "failed 1" in err
    code = (
        "import sys; from gen_pipeline.progress.display import Progress; Progress('log'); print('tqdm' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
