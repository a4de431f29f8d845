"""Answers that are 200 but not completions: empty ones and ones from another model never reach the output."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from e2e import check_invariant, prompts, read_jsonl

from gen_pipeline.config import RetryPolicy, RunConfig, parse_reasons
from gen_pipeline.http import ChatResult
from gen_pipeline.modes import run_async
from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.tokens import TINY_TOKENIZER

MODEL = "sim-model"  # what the simulated fleet serves


def odd_app(answer: dict[str, Any], served: str = MODEL) -> web.Application:
    """A server that passes discovery as `served` and answers every chat request 200 with `answer`."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": served, "max_model_len": 8192}]})

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"tokenizer_path": str(TINY_TOKENIZER)})

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        choice = {"index": 0, "message": {"role": "assistant", **answer.get("message", {})}, "finish_reason": "stop"}
        return web.json_response(
            {
                "model": answer.get("model", body["model"]),
                "choices": [choice],
                "usage": answer.get("usage", {"completion_tokens": 0}),
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/server_info", ok)
    app.router.add_get("/health", ok)
    app.router.add_post("/v1/chat/completions", chat)
    return app


EMPTY = {"message": {"content": None, "reasoning_content": None}}
BLANK = {"message": {"content": ""}}
WRONG = {"model": "another-model", "message": {"content": "an answer from the wrong model"}}


@asynccontextmanager
async def fleet(answers: list[dict[str, Any]], good: int = 1) -> AsyncIterator[list[str]]:
    """`good` simulated servers plus one odd server per answer; their URLs."""
    odd = [TestServer(odd_app(a), host="127.0.0.1") for a in answers]
    for server in odd:
        await server.start_server()
    try:
        if good:
            async with await start_fleet(SimConfig(ports=tuple(free_ports(good)), health_delay=0.0)) as sim:
                yield [*sim.urls, *(str(s.make_url("")).rstrip("/") for s in odd)]
        else:
            yield [str(s.make_url("")).rstrip("/") for s in odd]
    finally:
        for server in odd:
            await server.close()


def generate(path: Path, out: Path, answers: list[dict[str, Any]], good: int = 1, **run: Any) -> Any:
    """Run generate against the fleet, with a deadline."""

    async def go() -> Any:
        async with fleet(answers, good) as urls:
            settings = {"retry": RetryPolicy.testing(), "progress": "off", "max_tokens": 32, **run}
            return await run_async(RunConfig(input=path, out=out, servers=tuple(urls), **settings))

    return asyncio.run(asyncio.wait_for(go(), 60))


def nested(levels: int) -> Any:
    """A JSON value `levels` lists deep."""
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


# tool-call arguments nested deeper than orjson writes: read fine, but a line holding them cannot be written
DEEP_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": nested(300)}}
DEEP = {"message": {"content": "fine", "tool_calls": [DEEP_CALL]}}
ODD_ANSWERS = [(EMPTY, "empty_completion"), (BLANK, "empty_completion"), (WRONG, "wrong_model"), (DEEP, "server_error")]


@pytest.mark.parametrize(("answer", "want"), ODD_ANSWERS, ids=["null", "blank", "wrong-model", "too-deep"])
def test_odd_answers_count_against_the_server_and_go_elsewhere(write_jsonl, tmp_path, answer, want):
    """Beside a good server, every row completes there; the odd server's answers are never written and
    are counted against it (an answer too deep to be written ended the whole run with a traceback)."""
    rows = prompts(30)
    out = tmp_path / "out"
    outcome = generate(write_jsonl(rows), out, [answer])
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 30
    lines = read_jsonl(out / "completions.jsonl")
    assert all(r["completion"] for r in lines)
    odd_url = list(outcome.summary["servers"])[-1]
    assert not any(r["server"] == odd_url for r in lines)
    assert outcome.summary["servers"][odd_url]["failures"].get(want, 0) > 0
    check_invariant([r["id"] for r in rows], out)


def test_every_attempt_empty_is_a_permanent_empty_completion(write_jsonl, tmp_path):
    """Only empty answers: the rows end as empty_completion (exit 0, permanent); a rerun leaves them, and
    --retry-failed empty_completion sends them again."""
    rows = prompts(2)
    path, out = write_jsonl(rows), tmp_path / "out"
    first = generate(path, out, [EMPTY], good=0, retry=RetryPolicy.testing(max_attempts=2))
    assert first.exit_code == 0 and first.summary["failed"] == {"empty_completion": 2}
    ledger = read_jsonl(out / "failures.jsonl")
    assert {r["reason"] for r in ledger} == {"empty_completion"} and all(r["attempts"] == 2 for r in ledger)
    assert read_jsonl(out / "completions.jsonl") == []
    again = generate(path, out, [], good=1)
    assert again.summary["skipped"] == {"empty_completion": 2} and again.summary["completed"] == 0
    retried = generate(path, out, [], good=1, retry_failed=parse_reasons("empty_completion"))
    assert retried.summary["completed"] == 2
    check_invariant([r["id"] for r in rows], out)


def test_every_attempt_from_another_model_is_wrong_model(write_jsonl, tmp_path):
    """Only wrong-model answers: the rows end as wrong_model, a transient reason (exit 3, rerun retries)."""
    rows = prompts(2)
    path, out = write_jsonl(rows), tmp_path / "out"
    first = generate(path, out, [WRONG], good=0, retry=RetryPolicy.testing(max_attempts=2))
    assert first.exit_code == 3 and first.summary["failed"] == {"wrong_model": 2}
    assert read_jsonl(out / "completions.jsonl") == []
    again = generate(path, out, [], good=1)
    assert again.exit_code == 0 and again.summary["completed"] == 2


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"content": ""}, "empty_completion"),
        ({"content": "", "reasoning_content": "thinking..."}, None),  # reasoning only: kept
        ({"content": "hi", "model": "other"}, "wrong_model"),
        ({"content": "hi", "model": MODEL}, None),
        ({"content": "hi"}, None),  # no model field: nothing to compare
    ],
)
def test_check_answer_table(fields, error):
    """Which 200 answers are completions."""
    from gen_pipeline.errors import RequestError
    from gen_pipeline.send.requests import check_answer

    result = ChatResult(finish_reason="stop", prompt_tokens=5, completion_tokens=1, **fields)

    if error is None:
        assert check_answer(result, MODEL, "s") is result
    else:
        with pytest.raises(RequestError) as info:
            check_answer(result, MODEL, "s")
        assert info.value.reason == error and info.value.server == "s" and info.value.status == 200


def test_mixed_failures_end_as_transient(write_jsonl, tmp_path):
    """An empty answer on one attempt, a 500 on the other: not every answer was refused, so server_error."""
    rows = prompts(1)
    out = tmp_path / "out"

    async def go() -> Any:
        failing = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, p500=1.0)
        async with fleet([EMPTY], good=0) as urls, await start_fleet(failing) as sim:
            cfg = RunConfig(input=write_jsonl(rows), out=out, servers=(*urls, *sim.urls), progress="off",
                            max_tokens=16, retry=RetryPolicy.testing(max_attempts=2))  # fmt: skip
            return await run_async(cfg)

    outcome = asyncio.run(asyncio.wait_for(go(), 60))
    assert outcome.exit_code == 3 and outcome.summary["failed"] == {"server_error": 1}
    [entry] = read_jsonl(out / "failures.jsonl")
    assert entry["attempts"] == 2


def test_a_completion_that_cannot_be_written_is_ledgered_and_the_run_goes_on(tmp_path):
    """The recorder's last guard: a completion no line can hold (past the client's check) goes to the
    ledger as a transient server_error for its id and sample, and the next one is still written."""
    from gen_pipeline.engine.recorder import Recorder
    from gen_pipeline.progress.stats import RunStats
    from gen_pipeline.records import Completion, Prompt
    from gen_pipeline.rundir.store import RunWriter
    from gen_pipeline.send.dispatch import Sent

    out = tmp_path / "out"
    out.mkdir()
    writer = RunWriter(out, 1.0)
    config = RunConfig(input=tmp_path / "in.jsonl", out=out, servers=("http://127.0.0.1:1",))
    recorder = Recorder(config, writer, RunStats(), "tok", lambda *_: None, [])

    def done(i: int, meta: Any) -> Completion:
        return Completion(i, [{"role": "user", "content": "q"}], "a", "stop", 5, 5, 1, 8, "s", 1, 0.1, MODEL, meta)

    prompt = Prompt(0, 1, [{"role": "user", "content": "q"}])
    assert recorder.sent(prompt, Sent([done(0, {"deep": nested(300)})])) is True
    assert recorder.sent(Prompt(1, 2, [{"role": "user", "content": "q"}]), Sent([done(1, {})])) is False
    writer.close()
    assert [r["id"] for r in read_jsonl(out / "completions.jsonl")] == [1]
    (entry,) = read_jsonl(out / "failures.jsonl")
    assert (entry["id"], entry["reason"]) == (0, "server_error") and "cannot be written" in entry["detail"]
