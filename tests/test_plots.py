"""The report's plots and drift line, on the shapes that made them unreadable: long tails, down servers, resumes."""

from __future__ import annotations

from typing import Any

import pytest

from gen_pipeline.views.plots import (
    PLOTS,
    draw_servers,
    input_bins,
    mean_in_flight,
    plot_inputs,
    plot_throughput,
    throughput_series,
    timed_series,
)
from gen_pipeline.views.report import drift_text
from gen_pipeline.views.rundata import Completions

pytest.importorskip("matplotlib")


def completions(n: int, server: str = "http://a:1", latency: float = 1.0, **fields: Any) -> list[dict[str, Any]]:
    """Completion lines as generate writes them (only the columns the report reads)."""
    base = {"input_tokens": 100, "completion_tokens": 50, "max_tokens": 64, "finish_reason": "stop"}
    return [{"id": i, "server": server, "latency_s": latency, **base, **fields} for i in range(n)]


def rows_of(lines: list[dict[str, Any]]) -> Completions:
    rows = Completions()
    for line in lines:
        rows.add(line)
    return rows


def axes() -> Any:
    from matplotlib.figure import Figure

    return Figure().subplots()


def test_a_few_long_prompts_go_to_an_overflow_bar():
    """99% short rows and a few very long ones: bins stop at p99, the long ones in one labelled bar."""
    values = [100 + i % 50 for i in range(990)] + [8000] * 10
    edges, cut = input_bins(values)
    assert cut == 149 and edges[-1] == 149
    ax = axes()
    plot_inputs(ax, values, 8192)
    assert "clipped at p99" in ax.get_title()
    heights = [p.get_height() for p in ax.patches]
    assert sum(heights) == 1000  # every row is in a bar: the 10 long ones in the overflow bar
    right = max(p.get_x() + p.get_width() for p in ax.patches)
    assert right <= ax.get_xlim()[1]


def test_no_overflow_bar_without_a_far_tail():
    """Lengths without outliers keep plain bins to the longest row."""
    edges, cut = input_bins(list(range(100, 300)))
    assert cut is None and edges[-1] == 299


def test_server_bars_fit_and_a_down_server_is_labelled():
    """Every bar and its label lie inside the axes; a server with no request in the last run says DOWN."""
    rows = rows_of(completions(300, "http://a:1") + completions(40, "http://b:2"))
    summary = {
        "servers": {
            "http://a:1": {"requests": 300, "failures": {}},
            "http://b:2": {"requests": 90, "failures": {"timeout": 50}, "out_of_service_s": 12.5},
            "http://c:3": {"requests": 0, "failures": {}},
        }
    }
    ax = axes()
    draw_servers(ax, rows, summary)
    right = max(p.get_x() + p.get_width() for p in ax.patches)
    assert right == 300 and ax.get_xlim()[1] >= 1.5 * right
    texts = {t.get_text().strip() for t in ax.texts}
    assert texts == {
        "300 done",
        "40 done, 50 failed  out of service 12.5 s in the last run",
        "0 done  DOWN: no request in the last run",
    }


def test_throughput_covers_every_run_of_the_directory():
    """After a resume, the time axis spans both runs: the last run's concurrency times all the lines."""
    rows = rows_of(completions(100) + completions(100))
    summary = {"completed": 100, "elapsed_s": 10.0}  # the last run: 100 lines of 1 s in 10 s, 10 in flight
    in_flight, resumed_at = mean_in_flight(rows, summary)
    assert in_flight == pytest.approx(10.0) and resumed_at == 100
    x, rate, *_ = throughput_series(rows.latency, rows.completion_tokens, in_flight, buckets=20)
    assert x[-1] == pytest.approx(20.0) and rate == pytest.approx([500.0] * 20)


def _run(start: float, n: int, latency: float, per_second: float) -> list[dict[str, Any]]:
    """`n` lines of one run: the first answer `latency` s after `start`, then `per_second` a second."""
    return [
        {**line, "time": start + latency + i / per_second} for i, line in enumerate(completions(n, latency=latency))
    ]


def test_throughput_after_a_resume_is_read_from_each_lines_time():
    """Issue 29: run 1 kept 40 requests of 4 s in flight, its resume (an hour later) 10 of 1 s; both made 500
    tokens/s. The last run's concurrency made run 1 look 4x slower and 4x longer; each line's own time does not,
    and the hour between the runs is cut out."""
    rows = rows_of(_run(1e9, 400, 4.0, 10.0) + _run(1e9 + 3600, 100, 1.0, 10.0))
    estimated = throughput_series(
        rows.latency, rows.completion_tokens, mean_in_flight(rows, {"completed": 100, "elapsed_s": 10.0})[0], buckets=20
    )
    assert estimated[0][-1] == pytest.approx(170.0)  # what the plot showed before: 160 s for run 1
    timed = timed_series(rows, buckets=20)
    assert timed is not None
    x, rate, _, pauses = timed
    assert x[-1] == pytest.approx(4.0 + 39.9 + 1.0 + 9.9)
    assert sorted(rate)[10] == pytest.approx(500.0, rel=0.1) and max(rate) < 560
    assert pauses == [pytest.approx(43.9)]


def test_lines_without_a_time_still_plot(tmp_path):
    """A directory written before lines carried their time is plotted on the estimated axis."""
    rows = rows_of(completions(50) + _run(1e9, 50, 1.0, 10.0))
    assert timed_series(rows) is None
    plot_throughput(rows, {"completed": 50, "elapsed_s": 5.0}, tmp_path / "t.png")
    plot_throughput(rows_of(_run(1e9, 50, 1.0, 10.0)), None, tmp_path / "u.png")
    assert (tmp_path / "t.png").stat().st_size and (tmp_path / "u.png").stat().st_size


def test_no_single_bar_finish_reason_chart():
    """finish_reason counts live in the output histogram's legend (and the table), not in a chart of their own."""
    assert PLOTS == ("lengths.png", "throughput.png", "servers.png")


@pytest.mark.parametrize(
    ("drift", "text"),
    [
        ({"compared": 200, "differed": 0, "by_offset": {}}, "0 of 200 rows (0.0%) differed; "),
        (
            {"compared": 10, "differed": 4, "by_offset": {"-1": 1, "2": 3}},
            "4 of 10 rows (40.0%) differed; server count - ours: min -1, median 0, max 2",
        ),
        (
            {"compared": 3, "differed": 3, "by_offset": {"5": 3}},
            "3 of 3 rows (100.0%) differed; server count - ours: min 5, median 5, max 5",
        ),
        ({"compared": 0}, "no row compared"),
    ],
)
def test_drift_is_a_readable_line(drift, text):
    """The report says how many rows differed and the spread of the difference, not a raw dict."""
    assert drift_text(drift).startswith(text)
