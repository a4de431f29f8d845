"""Rows that begin alike, read far apart: `Scatter` follows one group in SAMPLE and counts the rows that came
after more prompt tokens than the fleet's caches hold since their group's last row; summary.json warns, and
points to `prepare --group-prefixes`, only when many did."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.progress import scatter
from gen_pipeline.progress.scatter import SAMPLE, Scatter
from gen_pipeline.records import group_digest


def cuts(conversations: int) -> list[list[dict[str, str]]]:
    """Each conversation of 4 user turns cut at each turn: rows of 1, 3, 5 and 7 messages."""
    rows = []
    for c in range(conversations):
        messages: list[dict[str, str]] = []
        for k in range(4):
            messages.append({"role": "user", "content": f"conversation {c}, turn {k}"})
            rows.append(list(messages))
            messages.append({"role": "assistant", "content": f"answer {k}"})
    return rows


def read(rows: list[list[dict[str, str]]], tokens: int = 1000) -> Scatter:
    s = Scatter()
    for messages in rows:
        s.note(messages, None, tokens)
    return s


def test_shuffled_cuts_of_conversations_are_warned_of_and_grouped_ones_are_not() -> None:
    """400 conversations as 4 rows each, 1,000 tokens a row, against caches of 100k (100 rows): shuffled, most
    later rows of a followed conversation come far from its last; in order, none does."""
    rows = cuts(400)
    in_order = read(rows)
    assert in_order.rows == 1200  # the rows of one message are not followed
    assert in_order.gaps and max(in_order.gaps) == 0
    assert in_order.warning(100_000) is None
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    s = read(shuffled)
    followed = sum(1 for c in range(400) if group_digest(cuts(400)[4 * c], None)[0] % SAMPLE == 0)
    assert 0 < followed < 400
    assert len(s.gaps) <= 3 * followed  # a followed conversation's second row on has a gap
    far = s.far(100_000)
    assert far >= len(s.gaps) // 2
    warning = s.warning(100_000)
    assert warning is not None
    assert warning.startswith(f"about {far * SAMPLE:,} of the 1,200 rows of more than one message are read after more ")
    assert "`gen-pipeline prepare --group-prefixes` writes such rows together" in warning
    assert s.warning(10**9) is None  # caches that hold the whole input: nothing was far


def test_the_gap_is_the_tokens_read_between_two_rows_of_a_group() -> None:
    """Rows of other groups and of one message count in the gap; the rows of the group themselves do not."""
    s = Scatter()
    head = next(
        [{"role": "system", "content": f"s{i}"}, {"role": "user", "content": "q"}]
        for i in range(1000)
        if group_digest([{"role": "system", "content": f"s{i}"}, {"role": "user", "content": "q"}], None)[0] % SAMPLE
        == 0
    )
    s.note(head, None, 500)
    s.note([{"role": "user", "content": "one message"}], None, 70)
    s.note([{"role": "user", "content": "another"}, {"role": "assistant", "content": "x"}], [{"t": 1}], 30)
    s.note([*head, {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}], None, 900)
    assert list(s.gaps) == [100]
    assert s.tokens == 1500


def test_tools_make_another_group() -> None:
    """The same messages with other tools begin otherwise (what prepare groups by)."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert group_digest(messages, None) != group_digest(messages, [{"type": "function"}])
    assert group_digest(messages, None) == group_digest([*messages, {"role": "assistant", "content": "a"}], None)


def test_the_warning_reaches_check_and_the_summary(tmp_path: Path, monkeypatch: Any) -> None:
    """A shuffled file of conversation cuts on a simulated fleet whose caches hold a few rows: `check` warns
    before the run and summary.json after it; the same rows in conversation order get neither."""
    from e2e import run_sim
    from test_check import check, sim

    monkeypatch.setattr(scatter, "SAMPLE", 1)  # every conversation followed: 30 are enough
    monkeypatch.setattr(scatter, "MIN_FAR", 1)
    rows = [{"id": i, "messages": m} for i, m in enumerate(cuts(30))]
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    fleet = {"n_ports": 2, "max_total_tokens": 200}  # caches of 400 tokens in all: a few rows
    for name, order, warned in (("shuffled", shuffled, True), ("grouped", rows, False)):
        inp = tmp_path / f"{name}.jsonl"
        inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in order))
        report = check([sim(2, max_total_tokens=200)], inp, tmp_path / f"check-{name}", max_tokens=16)
        assert report["ok"], report["problems"]
        before = [w for w in report["warnings"] if "prepare --group-prefixes" in w]
        outcome, _ = run_sim(inp, tmp_path / name, fleet, max_tokens=16)
        assert outcome.summary["completed"] == len(rows)
        after = [w for w in outcome.summary["warnings"] if "prepare --group-prefixes" in w]
        assert bool(before) is bool(after) is warned, (name, report["warnings"], outcome.summary["warnings"])
        if warned:
            assert before == after  # the same rows, the same caches: the same figures


def test_a_server_down_all_run_adds_no_cache_to_the_warning(tmp_path: Path, monkeypatch: Any) -> None:
    """Of three servers one is down before and during the run: its cache holds nothing. `check` counts the two
    that answer, and summary.json the two that served (not a default-sized cache for the dead one, which hid
    the warning): the same warning before and after."""
    from e2e import run_sim
    from test_check import check

    from gen_pipeline.sim import SimConfig, free_ports

    monkeypatch.setattr(scatter, "SAMPLE", 1)
    monkeypatch.setattr(scatter, "MIN_FAR", 1)
    rows = [{"id": i, "messages": m} for i, m in enumerate(cuts(30))]
    random.Random(5).shuffle(rows)
    inp = tmp_path / "shuffled.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    ports = tuple(free_ports(3))
    down = SimConfig(ports=ports, dead=(ports[1],), max_total_tokens=200, health_delay=0.0)
    report = check([down], inp, tmp_path / "check", max_tokens=16)
    before = [w for w in report["warnings"] if "prepare --group-prefixes" in w]
    fleet = {"n_ports": 3, "max_total_tokens": 200, "per_port": lambda p: {"dead": (p[1],)}}
    outcome, _ = run_sim(inp, tmp_path / "run", fleet, max_tokens=16)
    assert outcome.summary["completed"] == len(rows)
    after = [w for w in outcome.summary["warnings"] if "prepare --group-prefixes" in w]
    assert before and before == after, (report["warnings"], outcome.summary["warnings"])
    assert "400 prompt tokens" in before[0]
