"""Telling rows from servers. The same 400 from every server, row after row, is the fleet's fault: the run
stops and settles nothing; a 400 only some rows get is theirs (`bad_request`). A row every server answers
5xx while they serve other requests is the row's fault (`poison`); a fleet that fails everything is not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from e2e import assert_regenerated, check_invariant, conversation_rows, prompts, read_jsonl, run_sim

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.modes import run_async
from gen_pipeline.records import Completion, Failure, Prompt
from gen_pipeline.send.dispatch import Sent
from gen_pipeline.send.refusals import END_EVIDENCE, REFUSAL_STREAK, RefusalJudge
from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.tokens import TINY_TOKENIZER

BROKEN = "Chat template error: jinja2 is not installed"


@pytest.mark.parametrize("n", [5, 600], ids=["a small run", "a long run"])
def test_a_fleet_refusing_every_row_the_same_way_stops_the_run(write_jsonl, tmp_path, n):
    """Every server answers every request 400 with one message (a broken chat template): the run stops with
    that message and exit 4, nothing is ledgered, and a rerun on the mended fleet completes every row."""
    rows = prompts(n)
    path, out = write_jsonl(rows), tmp_path / "out"
    broken, fleet = run_sim(path, out, {"template_error": BROKEN, "n_ports": 3})
    assert broken.exit_code == 4, broken.summary
    assert BROKEN in broken.summary["stop_reason"] and "misconfigured" in broken.summary["stop_reason"]
    assert broken.summary["failed"] == {} and not read_jsonl(out / "failures.jsonl")
    # stopped early: fewer rows asked than the input holds (each refused row is asked of two servers)
    assert sum(s.requests for s in fleet.stats.values()) < 2 * n or n < REFUSAL_STREAK
    mended, _ = run_sim(path, out, {"n_ports": 3})
    assert mended.exit_code == 0 and mended.summary["completed"] == n
    assert check_invariant([r["id"] for r in rows], out) == {"done": n, "ledger": 0}


@pytest.mark.parametrize("n", [5, 60], ids=["a small run", "a long run"])
def test_a_fleet_refusing_every_conversation_the_same_way_stops_the_run(write_jsonl, tmp_path, n):
    """--turns all goes through the same judge: a broken template stops the run (exit 4) with nothing
    ledgered (every conversation was ledgered bad_request at turn 0, exit 0), and the mended fleet then
    answers every turn of every conversation."""
    rows = conversation_rows(n)
    path, out = write_jsonl(rows), tmp_path / "out"
    broken, _ = run_sim(path, out, {"template_error": BROKEN, "n_ports": 3}, turns="all", samples=2)
    assert broken.exit_code == 4, broken.summary
    assert BROKEN in broken.summary["stop_reason"] and "misconfigured" in broken.summary["stop_reason"]
    assert broken.summary["failed"] == {} and not read_jsonl(out / "failures.jsonl")
    assert "ended_early" not in broken.summary.get("conversations", {})
    mended, _ = run_sim(path, out, {"n_ports": 3}, turns="all", samples=2)
    assert mended.exit_code == 0 and mended.summary["failed"] == {}, mended.summary
    assert mended.summary["conversations"] == {"complete": 2 * n, "ended_at_turn": {}}
    assert_regenerated(rows, out, samples=2)


def test_a_row_every_server_refuses_is_still_a_bad_request(write_jsonl, tmp_path):
    """A 400 that only some rows get (here rows mentioning "Q7:" and "Q17:") is theirs: bad_request."""
    rows = prompts(40)
    path, out = write_jsonl(rows), tmp_path / "out"
    outcome, _ = run_sim(path, out, {"poison": "Q7:", "poison_status": 400, "n_ports": 3})
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 39
    [entry] = read_jsonl(out / "failures.jsonl")
    assert (entry["id"], entry["reason"], entry["status"]) == (7, "bad_request", 400)
    assert check_invariant([r["id"] for r in rows], out) == {"done": 39, "ledger": 1}


def test_one_misconfigured_server_among_good_ones_settles_no_row(write_jsonl, tmp_path):
    """One server of three answers every row 400 (its chat template fails): each row it refuses is asked
    of another server, which serves it. Every row completes, none is ledgered bad_request for good (a third
    of them were, and the run exited 0), and the refusing server's 400s count against it."""
    rows = prompts(60)
    path, out = write_jsonl(rows), tmp_path / "out"

    async def go() -> Any:
        broken = TestServer(broken_app(), host="127.0.0.1")
        await broken.start_server()
        try:
            async with await start_fleet(SimConfig(ports=tuple(free_ports(2)), health_delay=0.0)) as sim:
                urls = (*sim.urls, str(broken.make_url("")).rstrip("/"))
                config = RunConfig(input=path, out=out, servers=urls, retry=RetryPolicy.testing(), progress="off")
                return await run_async(config), urls[-1]
        finally:
            await broken.close()

    outcome, bad = asyncio.run(asyncio.wait_for(go(), 60))
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 60, outcome.summary
    assert outcome.summary["failed"] == {} and not read_jsonl(out / "failures.jsonl")
    assert not any(r["server"] == bad for r in read_jsonl(out / "completions.jsonl"))
    assert outcome.summary["servers"][bad]["failures"].get("bad_request", 0) > 0
    assert check_invariant([r["id"] for r in rows], out) == {"done": 60, "ledger": 0}


def broken_app() -> web.Application:
    """A server that passes discovery (the simulator's model and tokenizer) and refuses every chat 400."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim-model", "max_model_len": 8192}]})

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"tokenizer_path": str(TINY_TOKENIZER)})

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({})

    async def chat(_: web.Request) -> web.Response:
        return web.json_response({"object": "error", "message": BROKEN, "type": "BadRequestError", "code": 400},
                                 status=400)  # fmt: skip

    app = web.Application()
    for path, handler in (("/v1/models", models), ("/model_info", model_info), ("/server_info", ok), ("/health", ok)):
        app.router.add_get(path, handler)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _prompt(i: int) -> Prompt:
    return Prompt(i, i + 1, [{"role": "user", "content": f"q{i}"}])


def _refused(i: int, server: str, message: str = "HTTP 400: no") -> Sent:
    return Sent([Failure(i, i + 1, "bad_request", message, status=400, server=server)])


def _done(i: int) -> Sent:
    return Sent([Completion(i, [], "a", "stop", 1, 1, 1, 8, "s0", 1, 0.1, "m", {})])


def test_refusals_between_completions_are_the_rows():
    """Bad rows among served ones, however many over a run, never stop it: each completion writes the
    refused rows held before it, and at the end the rest are written too."""
    written, stops = [], []
    judge = RefusalJudge(2, lambda p, s: written.append(p.id), stops.append)
    for i in range(10 * REFUSAL_STREAK):
        sent = _refused(i, f"s{i % 2}") if i % 4 else _done(i)
        assert judge.hold(_prompt(i), sent) is bool(i % 4)
    judge.finish()
    assert not stops and sorted(written) == [i for i in range(10 * REFUSAL_STREAK) if i % 4]


def test_one_message_from_one_server_of_two_is_not_the_fleet():
    """A streak from one server only (another may serve) does not stop the run; different messages reset it."""
    stops: list[str] = []
    judge = RefusalJudge(2, lambda p, s: None, stops.append)
    for i in range(2 * REFUSAL_STREAK):
        judge.hold(_prompt(i), _refused(i, "s0"))
    assert not stops
    for i in range(REFUSAL_STREAK - 1):
        judge.hold(_prompt(i), _refused(i, f"s{i % 2}", f"HTTP 400: row {i} is wrong"))
    judge.finish()
    assert not stops
    judge = RefusalJudge(1, lambda p, s: None, stops.append)
    for i in range(END_EVIDENCE):
        judge.hold(_prompt(i), _refused(i, "s0"))
    judge.finish()
    assert len(stops) == 1 and "the only server" in stops[0]


def test_a_row_that_breaks_every_server_is_poison_and_named(write_jsonl, tmp_path):
    """Every server answers one row 500 and serves the others: it is ledgered `poison` with the server's
    message and named in the summary; a rerun skips it (it paid the attempts and exited 3 every time);
    --retry-failed poison sends it again."""
    rows = prompts(60)
    path, out = write_jsonl(rows), tmp_path / "out"
    first, _ = run_sim(path, out, {"poison": "Q7:", "n_ports": 3})
    assert first.exit_code == 0 and first.summary["failed"] == {"poison": 1}
    [entry] = read_jsonl(out / "failures.jsonl")
    assert (entry["id"], entry["reason"], entry["status"]) == (7, "poison", 500) and "Q7:" in entry["detail"]
    [named] = [w for w in first.summary["warnings"] if "poison" in w]
    assert named.startswith("row 7 (line 8)") and "Internal server error on 'Q7:'" in named
    again, fleet = run_sim(path, out, {"poison": "Q7:", "n_ports": 3})
    assert again.exit_code == 0 and again.summary["skipped"] == {"done": 59, "poison": 1}
    assert sum(s.requests for s in fleet.stats.values()) == 0
    mended, _ = run_sim(path, out, {"n_ports": 3}, retry_failed=frozenset({"poison"}))
    assert mended.exit_code == 0 and mended.summary["completed"] == 1
    assert check_invariant([r["id"] for r in rows], out) == {"done": 60, "ledger": 1}


def test_rows_failing_as_often_as_the_fleet_fails_others_are_not_poison(write_jsonl, tmp_path):
    """Servers answering 30% of all requests 500, two attempts a row: a row failing both (about one in eleven)
    is what chance gives, not a row that breaks servers: server_error, retried by a rerun (it was ledgered
    poison, permanent, when the probes afterwards happened to pass)."""
    from gen_pipeline.config import RetryPolicy

    path, out = write_jsonl(prompts(300)), tmp_path / "out"
    outcome, _ = run_sim(path, out, {"p500": 0.3, "n_ports": 3}, retry=RetryPolicy.testing(max_attempts=2))
    assert outcome.exit_code == 3 and "poison" not in outcome.summary["failed"]
    assert outcome.summary["failed"]["server_error"] >= 5  # rows did fail every attempt


def test_a_fleet_failing_everything_is_not_poison(write_jsonl, tmp_path):
    """Servers that answer every request 500 are sick, not the rows: server_error, retried by a rerun."""
    path, out = write_jsonl(prompts(4)), tmp_path / "out"
    outcome, _ = run_sim(path, out, {"p500": 1.0, "n_ports": 3})
    assert outcome.exit_code == 3 and outcome.summary["failed"] == {"server_error": 4}
