"""Progress that says how far: the input's work counted beside the run, the bar's N/total, % and ETA on a
terminal, in a notebook and in log lines, one unit per figure, and `status` during --turns all and outages."""

from __future__ import annotations

import gzip
import logging
import re
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import FakeCounter
from e2e import conversation_rows, prompts, read_jsonl, run_sim

from gen_pipeline.config import RunConfig
from gen_pipeline.engine.reader import BatchReader
from gen_pipeline.engine.workload import Tally, start_count
from gen_pipeline.inputs.shape import RowShape
from gen_pipeline.progress import display
from gen_pipeline.progress.display import Progress, how_far
from gen_pipeline.progress.live import progress_line
from gen_pipeline.progress.stats import RunStats, format_summary, snapshot
from gen_pipeline.progress.work import Work
from gen_pipeline.resume.settled import ResumeState
from gen_pipeline.views.statustext import status_lines


def lines_of(rows: list[Any]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in rows)


def count(tmp_path: Path, data: bytes, turns: str = "last", samples: int = 1, **kw: Any) -> tuple[int, int] | None:
    """What the background count finds in an input holding `data`."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    config = RunConfig(input=path, out=tmp_path, turns=turns, samples=samples, limit=kw.pop("limit", None))
    shape = RowShape.of(None, turns)
    return Tally(turns == "all", samples, config.limit, kw.pop("cursor", 0), shape).count(config, threading.Event())


def test_the_count_is_rows_times_samples_without_blank_lines(tmp_path):
    """Rows, not lines: blank lines are no rows; a row's own samples count as it asks; a last line without
    a line end counts."""
    data = lines_of(prompts(10)) + b"\n\n" + lines_of([{"prompt": "x", "samples": 5}]) + b'{"prompt": "last"}'
    assert count(tmp_path, data) == (0, 10 + 5 + 1)
    assert count(tmp_path, data, samples=3) == (0, 3 * 11 + 5)


def test_the_count_keeps_to_the_limit_and_splits_at_the_cursor(tmp_path):
    """--limit N: the first N lines only; rows before the input cursor's byte are counted apart."""
    data = lines_of(prompts(100))
    cursor = len(lines_of(prompts(30)))
    assert count(tmp_path, data, limit=40) == (0, 40)
    assert count(tmp_path, data, cursor=cursor) == (30, 100)


def test_the_count_under_turns_all_is_turns_and_a_bad_row_is_one(tmp_path):
    """--turns all: each conversation's user turns (times samples); a line that is no row is one unit."""
    rows = conversation_rows(5, turns=3)  # 3 or 4 user turns each
    turns = sum(sum(m["role"] == "user" for m in r["messages"]) for r in rows)
    data = lines_of([*rows, b"{not json"])
    assert count(tmp_path, data, turns="all") == (0, turns + 1)
    assert count(tmp_path, data, turns="all", samples=2) == (0, 2 * turns + 1)


def test_the_count_under_turns_all_merges_consecutive_user_turns_as_they_are_sent(tmp_path):
    """Two user turns in a row are one turn (generate merges them): the bar's total is the turns the run
    settles (it said 800 for a run that settled 600, until the end)."""
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    row["messages"] += [{"role": "assistant", "content": "old"}, {"role": "user", "content": "c"}]
    config = RunConfig(input=tmp_path / "in.jsonl", out=tmp_path, turns="all", samples=2)
    (tmp_path / "in.jsonl").write_bytes(lines_of([row, row]))
    work = Work()
    start_count(config, 0, work, lambda: True).join(30)
    assert work.total == 2 * 2 * 2  # rows x samples x turns (3 user turns, 2 once merged)


def test_a_compressed_input_is_counted_and_a_parquet_file_by_its_metadata(tmp_path):
    """gzip is read as the run reads it; Parquet's row count comes from its metadata (--limit and --samples
    applied), not under --turns all; a CSV file (which takes reading) gets no total, and the bar goes on
    without one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert count(tmp_path, gzip.compress(lines_of(prompts(7)))) == (0, 7)
    table = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(9)]}), table)
    for config, expected in (
        (RunConfig(input=table, out=tmp_path, samples=2), 18),
        (RunConfig(input=table, out=tmp_path, limit=4), 4),
        (RunConfig(input=table, out=tmp_path, turns="all"), None),
    ):
        work = Work()
        start_count(config, 0, work, lambda: True).join(30)
        assert work.total == expected
    csv = tmp_path / "in.csv"
    csv.write_text("prompt\nq1\nq2\n")
    work = Work()
    start_count(RunConfig(input=csv, out=tmp_path), 0, work, lambda: True).join(30)
    assert work.total is None and work.carried is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_under_turns_all_counts_turns(write_jsonl, tmp_path):
    """--turns all: with every conversation read and a fifth of the turns answered, the ETA is the other
    four fifths at the rate turns settle ("ETA 0 s" from 19% on: rows read were set against turns done)."""
    rows = conversation_rows(40, turns=4)
    turns = sum(sum(m["role"] == "user" for m in r["messages"]) for r in rows)
    clock = Clock()
    stats = RunStats(clock=clock)
    config = RunConfig(input=write_jsonl(rows), out=tmp_path, turns="all")
    reader = BatchReader(config, FakeCounter(), ResumeState(), stats)
    while reader.next_batch()[0]:
        pass
    assert reader.counting is not None and stats.work.total is None  # it waits for the first settled row
    stats.completed = 1
    reader.counting.join(10)
    assert stats.work.total == turns and stats.input_fraction == 1.0
    clock.now, stats.completed = 100.0, turns // 5
    assert stats.eta() == pytest.approx((turns - turns // 5) / (turns // 5 / 100.0))
    doc = snapshot(stats, [], "running", clock.now)
    assert doc["counts"]["total"] == turns and doc["counts"]["unit"] == "turn"
    assert "turns settled (20%)" in status_lines(doc)[0]


def test_status_says_waiting_for_servers_during_an_outage():
    """With no server usable, status.json has no ETA and `status` says it waits for servers, not the rate
    and ETA from before the outage."""
    clock = Clock()
    stats = RunStats(clock=clock)
    stats.note_input(100, 0.5)
    clock.now, stats.completed = 10.0, 50
    assert stats.eta() is not None
    stats.outage_s = 45.0
    doc = snapshot(stats, [], "running", clock.now)
    assert doc["eta_s"] is None and doc["outage_s"] == 45.0
    text = "\n".join(status_lines(doc))
    assert "waiting for servers: none usable for 45 s" in text and "req/s" not in text, text


def test_a_resumed_turns_all_run_counts_every_figure_in_turns(write_jsonl, tmp_path):
    """--turns all resumed: skipped counts the turns earlier runs answered (it counted conversations), the
    bar's count reaches the total, and the end summary prints the conversations summary.json has."""
    rows = conversation_rows(6, turns=3)
    turns = sum(sum(m["role"] == "user" for m in r["messages"]) for r in rows)
    path, out = write_jsonl(rows), tmp_path / "out"
    run_sim(path, out, turns="all", limit=2)
    before = len(read_jsonl(out / "completions.jsonl"))
    outcome, _ = run_sim(path, out, turns="all")
    status = orjson.loads((out / "status.json").read_bytes())
    counts = status["counts"]
    assert outcome.summary["skipped"] == {"done": 2}  # rows, as summary.json has always counted them
    assert counts["skipped"] == before and counts["done"] == turns - before and counts["total"] == turns
    assert f"{turns} of {turns} turns settled (100%)" in status_lines(status)[0]
    assert "conversations 4 complete, 0 ended early" in format_summary(outcome.summary)


def test_progress_line_counts_skipped_in_the_run_unit():
    """The progress line's skipped figure is in the bar's unit (turns here), and turns a conversation will
    not send are named."""
    stats = RunStats()
    stats.work.unit, stats.work.skipped, stats.work.dropped = "turn", 12, 2
    stats.skipped["done"] = 3  # conversations
    line = progress_line(stats)
    assert "skipped 12" in line and "not sent 2" in line


def test_a_log_line_says_how_far(monkeypatch, caplog):
    """--progress log: each line starts with settled/total, the percentage and the ETA."""
    monkeypatch.setattr(display, "LOG_INTERVAL", 0.0)
    progress = Progress("log", "row")
    with caplog.at_level(logging.INFO, logger="gen_pipeline"):
        progress.update(50, "done 50", total=200, rate=10.0)
        progress.update(50, "done 50", total=None, rate=10.0)
    assert "progress: 50/200 rows (25%), ETA 15 s | done 50" in caplog.text
    assert "progress: 50 rows, total not known | done 50" in caplog.text
    assert how_far(10, 40, None, "turn") == "10/40 turns (25%), ETA unknown"


def test_the_terminal_bar_shows_n_of_total_percent_and_eta(write_jsonl, tmp_path, capsys):
    """--progress bar: tqdm's bar with the input's total, a percentage and an ETA while the run goes on."""
    sim = {"n_ports": 1, "max_running": 2, "token_latency": 0.002}
    run_sim(write_jsonl(prompts(60)), tmp_path / "out", sim, progress="bar", max_tokens=32, concurrency=2)
    err = capsys.readouterr().err
    frames = re.findall(r"(\d+)%\|[^|]*\| (\d+)/60 \[[\d:]+<([\d:?]+)", err)
    assert frames and frames[-1][:2] == ("100", "60"), err[-500:]
    assert any(0 < int(n) < 60 and eta != "?" for _, n, eta in frames), err[-2000:]


class FakeWidget:
    """tqdm.notebook's container: a label, the bar (whose max is the total) and a label."""

    class Bar:
        max = 1

    def __init__(self) -> None:
        self.children = [object(), self.Bar(), object()]


def test_the_notebook_bar_gets_the_total(monkeypatch):
    """In a notebook the bar is tqdm.auto's; once the count arrives the instance's total is set, and a
    notebook widget's bar gets it as its max."""
    from test_api import FakeShell, fake_ipython

    fake_ipython(monkeypatch, FakeShell(kernel=True))
    progress = Progress("auto", "row")
    assert progress.bar is not None  # a bar, although stderr is no terminal here
    progress.bar.container = FakeWidget()
    progress.update(5, "done 5", total=None, rate=None)
    assert progress.bar.total is None
    progress.update(10, "done 10", total=40, rate=2.0)
    assert progress.bar.total == 40 and progress.bar.n == 10
    assert progress.bar.container.children[1].max == 40
    assert progress.bar.format_dict["rate"] == 2.0  # its ETA: (40 - 10) / 2 s
    del progress.bar.container
    progress.close()
