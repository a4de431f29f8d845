"""--turns all: conversations replayed turn by turn with the target's own answers, exactly once."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import SYSTEM, conversation_rows, read_jsonl, run_sim

from gen_pipeline.inputs.rows import RowError
from gen_pipeline.records import id_key
from gen_pipeline.rundir.donekeys import line_key
from gen_pipeline.samples import line_place, place_key, sample_key, turn_key
from gen_pipeline.send.turns import split_turns


def places(out: Path) -> Counter[tuple[str, int, int]]:
    return Counter((str(r["id"]), r["sample"], r["turn"]) for r in read_jsonl(out / "completions.jsonl"))


def assert_histories(out: Path, log: Path, rows: list[dict[str, Any]]) -> None:
    """Each turn k > 0 was asked with turn k-1's recorded request and answer, then the row's next user
    turn; turn 0 with the row's first segment; no original assistant turn was ever sent."""
    lines = {(str(r["id"]), r["sample"], r["turn"]): r for r in read_jsonl(out / "completions.jsonl")}
    segments = {str(r["id"]): split_turns(r["messages"]) for r in rows}
    asked = [orjson.dumps(e["messages"]) for e in read_jsonl(log)]
    assert not any(b"ORIGINAL" in a for a in asked)
    for (rid, s, t), line in lines.items():
        if t == 0:
            expected = segments[rid][0]
        else:
            before = lines[(rid, s, t - 1)]
            answer = {"role": "assistant", "content": before["completion"]}
            if before.get("reasoning_content") is not None:
                answer["reasoning_content"] = before["reasoning_content"]
            expected = [*before["messages"], answer, *segments[rid][t]]
        assert line["messages"] == expected, (rid, s, t)
        assert orjson.dumps(expected) in asked


def test_split_turns_keeps_user_and_system_turns_and_drops_the_answers():
    messages = [
        SYSTEM,
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "x"},
        {"role": "developer", "content": "now French"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "y"},
    ]
    assert split_turns(messages) == [[SYSTEM, messages[1]], [messages[3], messages[4]]]


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([{"role": "user", "content": "a"}, {"role": "tool", "content": "r", "tool_call_id": "1"}], "tool turns"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
            ],
            "tool turns",
        ),
        ([SYSTEM, {"role": "assistant", "content": "x"}], "no user turn"),
    ],
)
def test_split_turns_refuses_what_cannot_be_replayed(messages, why):
    with pytest.raises(RowError, match=why):
        split_turns(messages)


def test_turn_keys_extend_the_sample_keys():
    """Turn 0's key is the (id, sample) key (a --turns last line's); later turns' keys are all distinct;
    a line's (sample, turn) is read without parsing it."""
    key = id_key("c1")
    assert place_key(key, 0, 0) == key and place_key(key, 2, 0) == sample_key(key, 2)
    keys = {place_key(key, s, t) for s in range(8) for t in range(8)}
    assert len(keys) == 64 and turn_key(key, 1) != sample_key(key, 1)
    line = b'{"id":"c1","sample":2,"turn":3,"messages":[]}\n'
    assert line_place(line) == (2, 3, 0) and line_key(line) == place_key(key, 2, 3)
    assert line_place(b'{"id":"c1","messages":[],"turn":4}\n') == (0, 4, 0)


@pytest.mark.parametrize(
    ("line", "place"),
    [
        (b'{"id":"c1","sample":2,"turn":3,"restart":2,"messages":[]}\n', (2, 3, 2)),
        (b'{"id":"c1","sample":1,"restart":5,"messages":[]}\n', (1, 0, 5)),
        (b'{"id":"c1","messages":[],"restart":1,"sample":1}\n', (1, 0, 1)),
        (b'{"id":"c1","sample":0,"restart":-1,"messages":[]}\n', None),
    ],
)
def test_a_lines_restart_generation_is_read_and_gives_it_keys_of_its_own(line, place):
    """A line of restart generation g carries `restart` after sample and turn, read fast or parsed; its key is
    generation g's (samples.py), every generation's keys distinct, generation 0's the keys lines always had."""
    key = id_key("c1")
    assert line_place(line) == place
    if place is not None:
        assert line_key(line) == place_key(key, *place) != place_key(key, place[0], place[1])
    keys = {place_key(key, s, t, g) for s in range(4) for t in range(4) for g in range(4)}
    assert len(keys) == 64 and place_key(key, 1, 2, 0) == place_key(key, 1, 2)


def test_every_turn_is_answered_once_with_the_targets_own_history(write_jsonl, tmp_path):
    rows = conversation_rows(12)
    log = tmp_path / "requests.jsonl"
    out = tmp_path / "out"
    sim = {"request_log": str(log), "n_ports": 3, "reasoning_words": 4}
    outcome, _ = run_sim(write_jsonl(rows), out, sim=sim, turns="all", samples=2)
    assert outcome.exit_code == 0, outcome.summary
    expected = Counter((r["id"], s, t) for r in rows for s in range(2) for t in range(len(split_turns(r["messages"]))))
    assert places(out) == expected
    assert_histories(out, log, rows)
    assert outcome.summary["conversations"] == {"complete": 24, "ended_early": 0, "ended_at_turn": {}} or (
        outcome.summary["conversations"]["complete"] == 24
    )
    assert len(read_jsonl(log)) == sum(expected.values())


def test_a_resume_goes_on_from_the_answers_recorded(write_jsonl, tmp_path):
    """Turns lost in a crash are asked again with the history as written, even an answer edited since."""
    rows = conversation_rows(6)
    path, out, log = write_jsonl(rows), tmp_path / "out", tmp_path / "requests.jsonl"
    run_sim(path, out, sim={"n_ports": 2, "request_log": str(log)}, turns="all")
    first = len(read_jsonl(log))
    done = out / "completions.jsonl"
    kept = [r for r in read_jsonl(done) if not (r["id"] in ("c1", "c4") and r["turn"] > 0)]
    for r in kept:
        if r["id"] == "c1" and r["turn"] == 0:
            r["completion"] = "EDITED answer"
    done.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    shutil.rmtree(out / ".index")  # the input cursor vouches for the rows it saw settled, as after a crash
    outcome, _ = run_sim(path, out, sim={"n_ports": 2, "request_log": str(log)}, turns="all")
    assert outcome.exit_code == 0, outcome.summary
    resent = read_jsonl(log)[first:]
    assert sorted((e["messages"][-1]["content"][:2]) for e in resent) == ["c1"] * 3 + ["c4"] * 2  # c1 has 4 turns, c4 3
    assert any("EDITED answer" in orjson.dumps(e["messages"]).decode() for e in resent)
    assert set(places(out).values()) == {1}
    assert_histories(out, log, rows)
    again, _ = run_sim(path, out, sim={"n_ports": 2}, turns="all")
    assert again.summary["requests"] == 0 and again.summary["skipped"] == {"done": 6}


def user_turns(texts: list[str]) -> list[dict[str, str]]:
    """A conversation of these user turns, each answered (consecutive user turns would be one turn)."""
    return [m for t in texts for m in ({"role": "user", "content": t}, {"role": "assistant", "content": "old"})]


def test_a_turn_that_no_longer_fits_ends_the_conversation(write_jsonl, tmp_path):
    """The context fills turn by turn: the turn without room is ledgered over_length with its number,
    the turns before it are kept, and the summary counts the conversation as ended early."""
    long = user_turns(["word " * 120] * 6)
    first = [{"role": "user", "content": "word " * 800}, {"role": "user", "content": "again"}]
    rows = [{"id": "long", "messages": long}, {"id": "first", "messages": first}, *conversation_rows(2)]
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, sim={"n_ports": 1, "context_length": 700}, turns="all", max_tokens=32)
    assert outcome.exit_code == 0, outcome.summary
    ledger = read_jsonl(out / "failures.jsonl")
    assert sorted((f["id"], f["reason"]) for f in ledger) == [("first", "over_length"), ("long", "over_length")]
    [no_answer] = [f for f in ledger if f["id"] == "first"]
    assert "after turn -1" not in no_answer["detail"]  # a first turn too long ends it before any answer
    ledger = [f for f in ledger if f["id"] == "long"]
    ended = ledger[0]["turn"]
    assert 0 < ended < 6 and f"turn {ended}" in ledger[0]["detail"]
    assert sorted(t for (i, _, t) in places(out) if i == "long") == list(range(ended))
    assert outcome.summary["conversations"]["ended_early"] == 2
    assert outcome.summary["conversations"]["ended_at_turn"] == {"0": 1, str(ended): 1}
    again, _ = run_sim(write_jsonl(rows), out, sim={"n_ports": 1, "context_length": 700}, turns="all", max_tokens=32)
    assert again.summary["requests"] == 0 and sum(again.summary["skipped"].values()) == 4


def test_rows_with_tool_turns_are_bad_input(write_jsonl, tmp_path):
    rows = [
        {
            "id": "t",
            "messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "r", "tool_call_id": "1"}],
        },
        *conversation_rows(1),
    ]
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, sim={"n_ports": 1}, turns="all")
    ledger = read_jsonl(out / "failures.jsonl")
    assert [(f["id"], f["reason"]) for f in ledger] == [("t", "bad_input")]
    assert "tool turns" in ledger[0]["detail"]
    assert outcome.exit_code == 0


def test_check_plans_the_first_turns_and_says_the_rest_wait_for_answers(write_jsonl, tmp_path):
    from gen_pipeline.config import RetryPolicy, RunConfig
    from gen_pipeline.preflight.check import run_check
    from gen_pipeline.preflight.plan import plan_lines
    from gen_pipeline.sim import SimConfig, free_ports, start_fleet

    rows = conversation_rows(4)  # 3, 4, 3, 4 user turns
    path = write_jsonl(rows)

    async def check() -> dict[str, Any]:
        async with await start_fleet(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as fleet:
            cfg = RunConfig(input=path, out=tmp_path / "out", servers=tuple(fleet.urls), turns="all", samples=2,
                            retry=RetryPolicy.testing(), progress="off")  # fmt: skip
            return await run_check(cfg)

    report = asyncio.run(asyncio.wait_for(check(), 30))
    plan = report["plan"]
    assert plan["prompts"] == 4 and plan["samples"] == 8 and plan["input_length"]["n"] == 4
    assert plan["later_turns"] == 2 * (2 + 3 + 2 + 3)
    assert any("depend on the answers" in line for line in plan_lines(report))


def test_export_writes_one_row_per_conversation(write_jsonl, tmp_path):
    """A --turns all run exports one row per (id, sample): the regenerated conversation with its reasoning,
    complete or ended early; --drop-incomplete leaves the ended ones out."""
    import pyarrow.parquet as pq

    from gen_pipeline.export.export import ExportConfig, export

    long = user_turns(["word " * 120] * 6)
    rows = [{"id": "long", "messages": long}, *conversation_rows(3)]
    run = tmp_path / "run"
    sim = {"n_ports": 2, "context_length": 700, "reasoning_words": 3}
    run_sim(write_jsonl(rows), run, sim=sim, turns="all", samples=2, max_tokens=32)
    stats = export(ExportConfig(runs=(run,), out=tmp_path / "ds"))
    table = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet"))).to_pylist()
    assert len(table) == 8 and stats.conversations == {"complete": 6, "ended_early": 2}
    lines = {(r["id"], r["sample"], r["turn"]): r for r in read_jsonl(run / "completions.jsonl")}
    for row in table:
        segments = split_turns(next(r for r in rows if r["id"] == row["id"])["messages"])
        assert row["conversation"] == ("ended_early" if row["id"] == "long" else "complete")
        assert [m["role"] for m in row["messages"]].count("assistant") == row["turns"]
        assert row["turns"] == (len(segments) if row["id"] != "long" else row["turns"])
        answers = [m for m in row["messages"] if m["role"] == "assistant"]
        recorded = [lines[(row["id"], row["sample"], t)] for t in range(row["turns"])]
        assert [a["content"] for a in answers] == [r["completion"] for r in recorded]
        assert [a["reasoning_content"] for a in answers] == [r.get("reasoning_content") for r in recorded]
        assert all(a["reasoning_content"] for a in answers)
    export(ExportConfig(runs=(run,), out=tmp_path / "ds2", drop_incomplete=True))
    kept = pq.read_table(next((tmp_path / "ds2" / "data").glob("*.parquet"))).to_pylist()
    assert sorted((r["id"], r["sample"]) for r in kept) == sorted((f"c{i}", s) for i in range(3) for s in range(2))


def sharegpt(turns: list[tuple[str, str]], **extra: Any) -> dict[str, Any]:
    return {"conversations": [{"from": f, "value": v} for f, v in turns], **extra}


def test_prepare_keep_turns_keeps_the_system_and_user_turns_and_dedups_on_them(tmp_path, write_jsonl):
    """--keep-turns: a ShareGPT conversation keeps its turns up to the last user turn, deduplicated on its system
    and user turns (other answers make no other row), tool conversations are invalid; consecutive human turns
    are one turn, so --turns all answers each user turn once; a --turns all run's ids are excluded."""
    from gen_pipeline.cli import main

    rows = [
        sharegpt([("system", "S"), ("human", "A"), ("gpt", "B"), ("human", "C"), ("gpt", "D")]),
        sharegpt([("system", "S"), ("human", "A"), ("gpt", "other"), ("human", "C "), ("gpt", "E")]),
        sharegpt([("human", "A"), ("gpt", "B")]),
        sharegpt([("human", "A"), ("function_call", "f()"), ("observation", "r")]),
        sharegpt([("human", "new"), ("gpt", "x"), ("human", "two")]),
        sharegpt([("human", "a"), ("human", "b"), ("gpt", "c"), ("human", "d")]),
    ]
    src, out = write_jsonl(rows, "src.jsonl"), tmp_path / "prompts.jsonl"
    assert main(["prepare", "--input", str(src), "--out", str(out), "--keep-turns"]) == 0
    kept = read_jsonl(out)
    asked = [[m["content"] for m in r["messages"] if m["role"] != "assistant"] for r in kept]
    assert asked == [["S", "A", "C"], ["A"], ["new", "two"], ["a\n\nb", "d"]]
    run = tmp_path / "run"
    run_sim(out, run, sim={"n_ports": 1}, turns="all")
    turns = Counter(r["id"] for r in read_jsonl(run / "completions.jsonl"))
    assert sorted(turns.values()) == [1, 2, 2, 2]  # each user turn answered once, none invented between a and b
    again = tmp_path / "again.jsonl"
    assert main(["prepare", "--input", str(src), "--out", str(again), "--keep-turns", "--exclude", str(run)]) == 0
    assert read_jsonl(again) == []


def test_a_server_keeps_room_for_a_conversations_next_turn():
    """A turn answered with `keep` leaves its place to the conversation's next turn: other requests see the
    server full, the next turn gets it (and goes elsewhere only when that server is out); given back, the
    place is anyone's."""
    from gen_pipeline.fleet.balancer import ServerPool, ServerState

    pool = ServerPool([ServerState("a", 1), ServerState("b", 1)], lambda: 100.0)
    a, b = pool.servers

    async def scenario() -> None:
        async with pool.lease(prefer=None, keep=True) as server:
            assert server is a
        assert (a.in_flight, a.homes) == (0, 1)
        assert pool.pick() is b  # a's place is kept
        b.in_flight = 1
        assert pool.pick() is None
        assert pool.pick(prefer="a", home=True) is a  # the next turn takes it
        async with pool.lease(prefer="a", home=True) as server:
            assert server is a and a.homes == 0
        b.in_flight = 0
        async with pool.lease(prefer=None, keep=True) as server:
            kept = server
        a.down_until = 200.0 if kept is a else a.down_until
        b.down_until = 200.0 if kept is b else b.down_until
        other = b if kept is a else a
        assert pool.pick(prefer=kept.url, home=True) is other  # out of service: elsewhere, the prefill paid
        pool.unhome(kept.url)
        assert kept.homes == 0

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_simulators_cache_holds_a_conversation_up_to_the_answer_it_gave(write_jsonl, tmp_path):
    """With a prefix cache, each turn after the first is served up to the previous turn's prompt and answer
    (cached_tokens); with affinity every turn pays only its new tokens."""
    rows = conversation_rows(8)
    out = tmp_path / "out"
    outcome, fleet = run_sim(write_jsonl(rows), out, sim={"n_ports": 3, "prefix_cache": 1000}, turns="all")
    assert outcome.exit_code == 0
    lines = {(r["id"], r["turn"]): r for r in read_jsonl(out / "completions.jsonl")}
    best = sum(
        r["prompt_tokens"]
        - (0 if t == 0 else lines[(i, t - 1)]["prompt_tokens"] + lines[(i, t - 1)]["completion_tokens"])
        for (i, t), r in lines.items()
    )
    stats = fleet.stats.values()
    paid = sum(s.prompt_tokens - s.cached_tokens for s in stats)
    assert paid == best < sum(s.prompt_tokens for s in stats)


def test_a_next_turn_waiting_behind_others_gets_the_room_kept_for_it():
    """Leases queued before it (new conversations) cannot take a kept place, and do not hold the next turn
    back: it is handed the place its server kept (a full fleet deadlocked here)."""
    from gen_pipeline.fleet.balancer import ServerPool, ServerState

    pool = ServerPool([ServerState("a", 1)], lambda: 100.0)

    async def scenario() -> None:
        async with pool.lease(keep=True):
            pass
        newcomer = asyncio.create_task(pool.lease().__aenter__())
        await asyncio.sleep(0)
        assert not newcomer.done()  # the place is kept
        lease = pool.lease(prefer="a", home=True)
        assert await asyncio.wait_for(lease.__aenter__(), 1) is pool.servers[0]
        await lease.__aexit__(None, None, None)
        assert await asyncio.wait_for(newcomer, 1) is pool.servers[0]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_in_the_tail_a_next_turn_gets_its_kept_room_however_many_are_kept():
    """Room kept for next turns can fill a server's queue margin too (capacity 4, margin 2: 6 kept, none in
    flight). In the tail, no request may queue past the capacity, but a next turn only uses the room kept
    for it: it is let in while fewer than the capacity run (it was refused, and so was everything else, and
    the run hung)."""
    from gen_pipeline.fleet.balancer import ServerPool, ServerState

    a = ServerState("a", 4)
    a.margin, a.homes = 2, 6
    pool = ServerPool([a], lambda: 100.0)
    pool.begin_tail(lambda: 6)
    assert pool.pick() is None  # a newcomer may not take kept room
    for running in range(4):
        assert pool.pick(prefer="a", home=True) is a, running
        a.in_flight, a.homes = a.in_flight + 1, a.homes - 1
    assert pool.pick(prefer="a", home=True) is None  # the capacity runs: the next one waits for a slot


@pytest.mark.parametrize("margin", [None, 0], ids=["default-margin", "no-margin"])
def test_whole_conversations_finish_with_a_dead_server_and_a_queue_margin(write_jsonl, tmp_path, margin):
    """One server of three is dead, the live ones run 4 and report it (a queue margin of 2): every turn of
    every conversation is answered. With the margin this hung in every run (20 of 84 lines written)."""
    rows = conversation_rows(12)
    out = tmp_path / "out"
    sim = {"n_ports": 3, "per_port": lambda ports: {"dead": ports[-1:]}, "max_running": 4,
           "report_max_running": True, "token_latency": 0.004, "seed": 3}  # fmt: skip
    run = {} if margin is None else {"queue_margin": margin}
    outcome, _ = run_sim(write_jsonl(rows), out, sim, timeout=90, turns="all", samples=2, max_tokens=32, **run)
    assert outcome.exit_code == 0, outcome.summary
    lines = read_jsonl(out / "completions.jsonl")
    want = 2 * sum(sum(m["role"] == "user" for m in r["messages"]) for r in rows)
    assert len(lines) == want == len({(r["id"], r["sample"], r["turn"]) for r in lines})


def test_retry_failed_goes_on_with_an_ended_conversation_and_status_and_report_count_it(write_jsonl, tmp_path):
    """--retry-failed over_length on a longer context goes on with the conversation at the turn that did not
    fit, from the answers written; status and report read the run."""
    from gen_pipeline.cli import main

    long = user_turns(["word " * 120] * 4)
    path, out = write_jsonl([{"id": "long", "messages": long}, *conversation_rows(2)]), tmp_path / "out"
    run_sim(path, out, sim={"n_ports": 1, "context_length": 700}, turns="all", max_tokens=32, context_length=700)
    ended = read_jsonl(out / "failures.jsonl")[0]["turn"]
    assert main(["status", str(out)]) == 0 and main(["report", str(out)]) == 0
    log = tmp_path / "requests.jsonl"
    again, _ = run_sim(
        path, out, sim={"n_ports": 1, "context_length": 4000, "request_log": str(log)}, turns="all", max_tokens=32,
        context_length=700, retry_failed=frozenset({"over_length"}), force=True,
    )  # fmt: skip
    assert again.summary["requests"] == 0  # the same context: it still does not fit
    more, _ = run_sim(
        path, out, sim={"n_ports": 1, "context_length": 4000, "request_log": str(log)}, turns="all", max_tokens=32,
        context_length=4000, retry_failed=frozenset({"over_length"}), force=True,
    )  # fmt: skip
    assert more.exit_code == 0 and more.summary["requests"] == 4 - ended
    assert sorted(t for (i, _, t) in places(out) if i == "long") == [0, 1, 2, 3]
    assert set(places(out).values()) == {1}


def test_the_workers_summaries_add_up_their_conversations():
    from gen_pipeline.engine.summary import merge_summaries

    a = {"completed": 5, "conversations": {"complete": 2, "ended_early": 1, "ended_at_turn": {"3": 1}}}
    b = {"completed": 4, "conversations": {"complete": 1, "ended_early": 2, "ended_at_turn": {"3": 1, "10": 1}}}
    merged = merge_summaries([a, b, {"completed": 0}], 1.0, 0)
    assert merged["conversations"] == {"complete": 3, "ended_early": 3, "ended_at_turn": {"3": 2, "10": 1}}
    assert "conversations" not in merge_summaries([{"completed": 1}], 1.0, 0)


def test_check_of_a_run_cut_mid_conversation_plans_only_the_turns_left(write_jsonl, tmp_path):
    """check --out on a --turns all run whose conversation lost its last turns (a crash): the plan counts the
    turns from where each conversation goes on, as generate then sends them (it counted them from turn 0
    again: 225 turns planned for 210 made in the reproduction)."""
    from gen_pipeline.config import RetryPolicy, RunConfig
    from gen_pipeline.preflight.check import run_check
    from gen_pipeline.sim import SimConfig, free_ports, start_fleet

    rows = conversation_rows(4)  # 3, 4, 3, 4 user turns
    path, run = write_jsonl(rows), tmp_path / "run"
    first, _ = run_sim(path, run, turns="all", samples=2)
    assert first.summary["completed"] == 2 * (3 + 4 + 3 + 4)
    lines = read_jsonl(run / "completions.jsonl")
    cut = rows[1]["id"]  # 4 turns: sample 0 keeps turn 0 only, sample 1 keeps turns 0 and 1
    kept = [r for r in lines if r["id"] != cut or r["turn"] < 1 + r["sample"]]
    (run / "completions.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    shutil.rmtree(run / ".index")  # as a crash leaves it: the input cursor never passed a conversation cut short

    async def check() -> dict[str, Any]:
        async with await start_fleet(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as fleet:
            cfg = RunConfig(input=path, out=run, servers=tuple(fleet.urls), turns="all", samples=2,
                            retry=RetryPolicy.testing(), progress="off")  # fmt: skip
            return await run_check(cfg, resume=True)

    plan = asyncio.run(asyncio.wait_for(check(), 30))["plan"]
    assert plan["samples"] == 2 and plan["later_turns"] == 2 + 1  # turns 2, 3 of sample 0; turn 3 of sample 1
    again, _ = run_sim(path, run, turns="all", samples=2)
    assert again.summary["completed"] == plan["samples"] + plan["later_turns"] == 5
