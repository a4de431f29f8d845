"""The input cursor: a resume that starts at the mark sees exactly what reading from the top would."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import check_invariant, prompts, read_jsonl, run_sim

from gen_pipeline.inputs.rows import BadRow
from gen_pipeline.inputs.source import PromptSource, Skipped
from gen_pipeline.progress.stats import format_summary
from gen_pipeline.resume import cursor
from gen_pipeline.resume.cursor import CursorKeeper, CursorLog, MarkTracker, mark_of
from gen_pipeline.resume.settled import ResumeState
from gen_pipeline.rundir.donekeys import KeySet

NAME = "prompts.jsonl"


def random_rows(rng: random.Random, n: int, ids: list[str]) -> list[Any]:
    """Rows with repeats, conflicts, key-order changes, id-less repeats, broken and invalid rows."""
    rows: list[Any] = []
    for _ in range(n):
        rid = rng.choice(ids)
        kind = rng.random()
        if kind < 0.55:
            rows.append({"id": rid, "prompt": f"text of {rid}"})
        elif kind < 0.62:
            rows.append({"prompt": f"text of {rid}", "id": rid})  # the same object, id not first
        elif kind < 0.70:
            rows.append({"id": rid, "prompt": f"other text {rng.randint(0, 2)}"})  # a conflict, mostly
        elif kind < 0.78:
            rows.append({"prompt": f"no id {rng.randint(0, 30)}" + " " * rng.randint(0, 2)})
        elif kind < 0.83:
            rows.append(f'{{"id": "{rid}", "prompt": '.encode())  # broken, its id readable
        elif kind < 0.87:
            rows.append(b"{broken")
        elif kind < 0.92:
            rows.append({"id": rid, "messages": []})  # invalid, parses
        elif kind < 0.95:
            rows.append(b"")
        else:
            rows.append({"id": rng.randint(0, 40), "prompt": "int id"})
    return rows


def write_rows(path: Path, rows: list[Any], mode: str = "wb") -> None:
    with path.open(mode) as f:
        for row in rows:
            f.write((row if isinstance(row, bytes) else orjson.dumps(row)) + b"\n")


def settle(items: list[Any], rng: random.Random, state: ResumeState, done: set[int]) -> list[bool]:
    """Play a run's outcome into `state`: prompts done, failed for good, or failed transiently; bad rows
    ledgered. Returns, per item, whether it is settled."""
    out = []
    for item in items:
        if isinstance(item, BadRow):
            state.bad_lines.add((NAME, item.line))
            out.append(True)
        elif isinstance(item, Skipped):
            out.append(True)
        else:
            fate = rng.random()
            if fate < 0.8:
                done.add(item.key)
            elif fate < 0.9:
                state.last_reason[item.key] = "over_length"
            else:
                state.last_reason[item.key] = "timeout"
            out.append(fate < 0.9)
    state.done = KeySet(done)
    return out


def read_pass(source: PromptSource) -> tuple[list[Any], list[Any]]:
    """Every item of a pass, and the mark right after each."""
    items, marks = [], []
    for item in source:
        items.append(item)
        marks.append(mark_of(source, source.log))
    return items, marks


def settled_items(ok: list[bool]) -> int:
    """How many items from the first are all settled."""
    return next((i for i, good in enumerate(ok) if not good), len(ok))


def view(items: list[Any], state: ResumeState, retry: frozenset[str] = frozenset()) -> tuple[Counter, list]:
    """What a run makes of a pass: skipped rows by reason (ledgered bad rows too, as BatchReader does),
    and the rows that need work."""
    tally: Counter[str] = Counter()
    work = []
    for item in items:
        if isinstance(item, BadRow) and (NAME, item.line) in state.bad_lines and "bad_input" not in retry:
            tally["bad_input"] += 1
        elif isinstance(item, Skipped):
            tally[item.reason] += item.count
        else:
            work.append((type(item).__name__, item.line, item.id))
    return tally, work


@pytest.mark.parametrize("seed", range(40))
def test_a_pass_from_the_cursor_equals_a_pass_from_the_top(tmp_path, seed):
    """Random inputs (repeats, conflicts, broken rows, id-less rows) and random run outcomes: after a
    run saved its mark and more rows were appended, the tallies and the rows needing work are the same
    whether the input is read from the cursor or from the top."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(rng.randint(5, 60))]
    path, out = tmp_path / NAME, tmp_path / "out"
    out.mkdir()
    write_rows(path, random_rows(rng, rng.randint(1, 120), ids))
    state, done = ResumeState(), set()
    source = PromptSource(path, state.rows(frozenset()), log=CursorLog())
    items, marks = read_pass(source)
    settled_prefix = settled_items(settle(items, rng, state, done))
    if settled_prefix == 0:
        pytest.skip("nothing settled before the first row")
    mark = marks[rng.randint(0, settled_prefix - 1)]
    CursorKeeper(out, path, None).save(mark, source.log)
    write_rows(path, random_rows(rng, rng.randint(0, 40), [*ids, "new1", "new2"]), "ab")

    for retry in (frozenset(), frozenset({"over_length"})):
        top = PromptSource(path, state.rows(retry))
        want_tally, want_work = view(list(top), state, retry)
        resumed = cursor.load(out, path, retry, state)
        before = {i.key for i in items if hasattr(i, "key") and i.line <= mark.line}
        reopened = any(state.last_reason.get(k) in retry for k in before)
        assert (resumed is None) == reopened  # only a --retry-failed that reopens a row refuses it
        if resumed is None:
            continue
        cur = PromptSource(path, state.rows(retry, resumed.prior), start=resumed.start)
        got_tally, got_work = view(list(cur), state, retry)
        got_tally.update(resumed.tallies)
        assert got_work == want_work
        assert +got_tally == +want_tally
        assert cur.repeats == top.repeats


@pytest.fixture
def saved(tmp_path):
    """An input of 50 rows, all done, with its cursor at the end."""
    path, out = tmp_path / NAME, tmp_path / "out"
    out.mkdir()
    rows = [*prompts(48), b"{broken", {"id": "bad", "messages": []}]
    write_rows(path, rows)
    state = ResumeState()
    source = PromptSource(path, state.rows(frozenset()), log=CursorLog())
    items = list(source)
    state.done = KeySet(i.key for i in items if not isinstance(i, BadRow))
    state.bad_lines = {(NAME, i.line) for i in items if isinstance(i, BadRow)}
    CursorKeeper(out, path, None).save(mark_of(source, source.log), source.log)
    return path, out, state


def test_a_valid_cursor_starts_after_the_settled_rows(saved):
    path, out, state = saved
    resumed = cursor.load(out, path, frozenset(), state)
    assert resumed is not None
    assert resumed.start.offset == path.stat().st_size and resumed.start.line == 50
    assert resumed.tallies == {"done": 48, "bad_input": 2}


def _flip_a_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(b"X" if byte != b"X" else b"Y")


@pytest.mark.parametrize(
    "change",
    [
        "edit_in_place",
        "reorder_rows",
        "truncate",
        "lose_completions",
        "lose_ledger",
        "retry_bad_input",
        "an_old_workers_cursor",
        "corrupt_cursor",
    ],
)
def test_any_change_the_cursor_cannot_vouch_for_means_reading_from_the_top(saved, change):
    """The input's bytes, its identity, the output and the ledger are all checked; a cursor that does
    not hold is ignored, never trusted."""
    path, out, state = saved
    retry = frozenset()
    if change == "edit_in_place":  # same inode, same size, one byte
        _flip_a_byte(path)
    elif change == "reorder_rows":  # rewritten by a script: same size, other order
        lines = path.read_bytes().splitlines(keepends=True)
        path.unlink()
        path.write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))
    elif change == "truncate":
        os.truncate(path, path.stat().st_size - 5)
    elif change == "lose_completions":
        state.done = KeySet(list(state.done)[1:])
    elif change == "lose_ledger":
        state.bad_lines = set()
    elif change == "retry_bad_input":
        retry = frozenset({"bad_input"})
    elif change == "an_old_workers_cursor":  # an older version's static worker 0 of 2 kept its own
        file = cursor.cursor_path(out, path)
        file.rename(file.with_name(file.name.replace(".all.", ".0of2.")))
    else:
        file = cursor.cursor_path(out, path)
        file.write_bytes(file.read_bytes()[:-3])
    assert cursor.load(out, path, retry, state) is None


def test_the_tracker_passes_a_batch_only_when_all_its_prompts_are_settled():
    tracker = MarkTracker()
    marks = ["m1", "m2", "m3"]
    r1 = tracker.batch(marks[0], [1, 2])
    r2 = tracker.batch(marks[1], [3])
    tracker.sealed(r1)
    tracker.sealed(r2)
    tracker.settled(3)
    assert tracker.mark is None  # batch 1 still has prompts in flight
    tracker.settled(1)
    tracker.settled(2)
    assert tracker.mark == "m2"
    r3 = tracker.batch(marks[2], [4, 5])
    tracker.sealed(r3)
    tracker.settled(4, ok=False)  # transient: read it again next time
    tracker.settled(5)
    assert tracker.mark == "m2" and tracker.held


def test_resume_from_the_cursor_end_to_end(write_jsonl, tmp_path):
    """A finished run leaves a cursor at the end of the input; the next run, with rows appended, reads
    only those, and its summary counts what reading from the top would."""
    rows = [*prompts(60), b"{broken", {"id": 3, "prompt": "conflict"}, prompts(1)[0]]
    path, out = write_jsonl(rows), tmp_path / "out"
    first, _ = run_sim(path, out)
    assert first.exit_code == 0 and first.summary["completed"] == 60
    assert cursor.cursor_path(out, path).exists()
    write_rows(path, [*prompts(10, start=60), prompts(1)[0], {"id": 5, "prompt": "another conflict"}], "ab")
    second, fleet = run_sim(path, out)
    assert second.summary["input_cursor"]["line"] == len(rows)
    assert f"input read from line {len(rows) + 1} (the input cursor" in format_summary(second.summary)
    idle = {u: {**v, "completions": 0, "mean_latency_s": None} for u, v in second.summary["servers"].items()}
    said = format_summary({**second.summary, "servers": idle})  # servers that answered nothing in this run
    assert "mean latency -," in said and "None s" not in said
    assert second.summary["completed"] == 10 and second.summary["failed"] == {"bad_input": 1}
    assert second.summary["skipped"] == {"done": 60, "bad_input": 2}
    assert second.summary["repeats_dropped"] == 2
    assert sum(s.requests for s in fleet.stats.values()) == 10
    # the same run read from the top (no cursor) counts the same
    for f in (out / ".index").glob("*.cursor"):
        f.unlink()
    third, _ = run_sim(path, out)
    assert third.summary["input_cursor"] is None
    assert third.summary["skipped"] == {"done": 70, "bad_input": 3} and third.summary["repeats_dropped"] == 2
    check_invariant([r["id"] for r in rows if isinstance(r, dict) and "id" in r], out)
    assert len(read_jsonl(out / "failures.jsonl")) == 3


def test_a_transient_failure_holds_the_cursor_before_its_row(write_jsonl, tmp_path):
    """Rows that failed transiently are read again by the next run: the cursor stops short of them."""
    from test_pipeline import _policy

    rows = prompts(40)
    path, out = write_jsonl(rows), tmp_path / "out"
    run_sim(path, out)
    write_rows(path, prompts(40, start=40), "ab")
    flaky, _ = run_sim(path, out, {"n_ports": 4, "p500": 0.5, "seed": 1}, retry=_policy(1), tokenize_batch=4)
    failed = flaky.summary["failed"].get("server_error", 0)
    assert flaky.exit_code == 3 and failed > 0 and flaky.summary["input_cursor"]["line"] == 40
    first_failed = min(r["line"] for r in read_jsonl(out / "failures.jsonl"))
    head = orjson.loads(cursor.cursor_path(out, path).read_bytes().split(b"\n")[0])
    assert 40 <= head["line"] < first_failed
    again, _ = run_sim(path, out, {"n_ports": 2})
    assert again.exit_code == 0 and again.summary["completed"] == failed
    assert again.summary["input_cursor"]["line"] == head["line"]
    check_invariant([r["id"] for r in prompts(80)], out)


@pytest.mark.parametrize("seed", range(20))
def test_cursors_chained_over_runs_and_saves(tmp_path, seed):
    """Several runs, each starting from the last cursor, saving it more than once and appending rows
    in between: the last cursor still gives what reading from the top gives."""
    rng = random.Random(1000 + seed)
    ids = [f"r{i}" for i in range(rng.randint(5, 40))]
    path, out = tmp_path / NAME, tmp_path / "out"
    out.mkdir()
    write_rows(path, random_rows(rng, rng.randint(1, 60), ids))
    state, done = ResumeState(), set()
    for _run in range(3):
        resumed = cursor.load(out, path, frozenset(), state)
        prior, start = (resumed.prior, resumed.start) if resumed else (None, None)
        source = PromptSource(path, state.rows(frozenset(), prior), start=start, log=CursorLog())
        keeper = CursorKeeper(out, path, resumed)
        items, marks = read_pass(source)
        settled_prefix = settled_items(settle(items, rng, state, done))
        for i in sorted(rng.sample(range(settled_prefix), min(2, settled_prefix))):
            keeper.save(marks[i], source.log)
        write_rows(path, random_rows(rng, rng.randint(0, 30), [*ids, f"n{_run}"]), "ab")
    want_tally, want_work = view(list(PromptSource(path, state.rows(frozenset()))), state)
    resumed = cursor.load(out, path, frozenset(), state)
    if resumed is None:
        assert not cursor.cursor_path(out, path).exists()  # no run ever settled its first row
        return
    cur = PromptSource(path, state.rows(frozenset(), resumed.prior), start=resumed.start)
    got_tally, got_work = view(list(cur), state)
    got_tally.update(resumed.tallies)
    assert (got_work, +got_tally) == (want_work, +want_tally)


def test_the_cursor_is_saved_while_the_run_goes_on(write_jsonl, tmp_path, monkeypatch):
    """Saved on an interval, not only at the end: the first resume after a crash starts near where the
    run was, not at the top."""
    import asyncio

    from e2e import run_against_sim

    monkeypatch.setattr(cursor, "INDEX_EVERY", 0.3)
    rows = prompts(300)
    path, out = write_jsonl(rows), tmp_path / "out"
    file = cursor.cursor_path(out, path)
    seen_lines: list[int] = []

    async def watch() -> Any:
        run = asyncio.create_task(
            run_against_sim(path, out, {"token_latency": 0.004, "n_ports": 2}, tokenize_batch=16, concurrency=8)
        )
        while not run.done():
            if file.exists():
                seen_lines.append(orjson.loads(file.read_bytes().split(b"\n")[0])["line"])
            await asyncio.sleep(0.1)
        return await run

    outcome, _ = asyncio.run(asyncio.wait_for(watch(), 60))
    assert outcome.exit_code == 0
    during = [n for n in seen_lines if n < len(rows)]
    assert len(set(during)) >= 2, seen_lines  # it moved while the run was going
    assert orjson.loads(file.read_bytes().split(b"\n")[0])["line"] == len(rows)
