"""generate and check against two real SGLang 0.5.23 servers on CPU (a tiny random Qwen3 with the real Qwen3
tokenizer and template), started once for the module: ~1.5-2 minutes on two busy cores, 2.8 GB each.

One server runs with `--reasoning-parser qwen3`, the other with `--tool-call-parser qwen25`; both with a 2048-token
context, a KV pool of 8192 tokens and `--enable-cache-report` (run/sglang/serve.py).

Needs what run/sglang/setup.sh puts in the cache (the venv and the model). Skipped with the reason when they are
absent, unless GEN_PIPELINE_REALSERVER=1 asks for them (as .ci/run does after setting them up): then their absence
is a failure. GEN_PIPELINE_SGLANG_URLS (two comma-separated URLs) names servers already running instead, started
with serve.py's settings and the two parsers in that order; they are left running.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import WEATHER_TOOL, conversation_rows, prompts, read_jsonl
from provenance_checks import OUTPUT_SETTINGS, assert_manifest_matches_servers

from gen_pipeline.config import DEFAULT_MAX_RESAMPLES, RetryPolicy, RunConfig
from gen_pipeline.modes import run_async
from gen_pipeline.preflight.check import render_check, run_check
from gen_pipeline.sim import free_ports
from gen_pipeline.tokens import load_counter

pytestmark = [pytest.mark.realserver, pytest.mark.slow]

RUN = Path(__file__).resolve().parents[1] / "run" / "sglang"
CACHE = Path(os.environ.get("GEN_PIPELINE_CACHE") or Path.home() / ".cache" / "gen-pipeline") / "sglang"
PYTHON = CACHE / "venv" / "bin" / "python"
MODEL = CACHE / "tiny-qwen3"
CTX = 2048
MAX_INPUT = CTX - 6  # SGLang's max_req_input_len: a prompt of this many tokens or more is refused
PARSERS = (["--reasoning-parser", "qwen3"], ["--tool-call-parser", "qwen25"])


def _serve() -> Any:
    """run/sglang/serve.py as a module of its own name (the vLLM tests import another `serve`)."""
    spec = importlib.util.spec_from_file_location("sglang_serve", RUN / "serve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two SGLang servers (the reasoning parser on the first, the tool-call parser on the second), started side
    by side and stopped after the module."""
    if os.environ.get("GEN_PIPELINE_SGLANG_URLS"):
        yield tuple(os.environ["GEN_PIPELINE_SGLANG_URLS"].split(","))
        return
    missing = [str(p) for p in (PYTHON, MODEL / "config.json") if not p.exists()]
    if missing:
        reason = f"SGLang venv or tiny model missing ({', '.join(missing)}); run run/sglang/setup.sh TOKENIZER_DIR"
        if os.environ.get("GEN_PIPELINE_REALSERVER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    serve, run_dir = _serve(), tmp_path_factory.mktemp("sglang")
    ports = free_ports(2)
    try:
        with ThreadPoolExecutor(2) as pool:
            starts = [pool.submit(serve.start, str(PYTHON), MODEL, p, run_dir, CTX, extra, 900)
                      for p, extra in zip(ports, PARSERS, strict=True)]  # fmt: skip
            urls = tuple(f.result() for f in starts)
        yield urls
    finally:
        serve.stop(run_dir)


@pytest.fixture(scope="module")
def counter():
    """The served model's own tokenizer and template, counting as SGLang does."""
    return load_counter(str(MODEL), "auto", "sglang")


def _config(inp: Path, out: Path, urls: tuple[str, ...], **kw: Any) -> RunConfig:
    settings = {"max_tokens": 8, "min_tokens": 1, "progress": "off", "retry": RetryPolicy.testing(), **kw}
    return RunConfig(input=inp, out=out, servers=urls, tokenizer=str(MODEL), **settings)


def _run(config: RunConfig, timeout: float = 600):
    return asyncio.run(asyncio.wait_for(run_async(config), timeout))


def _sized(counter, tokens: int) -> list[dict[str, Any]]:
    """A one-turn chat of exactly `tokens` prompt tokens."""
    words = tokens
    for _ in range(20):
        messages = [{"role": "user", "content": "word " * words}]
        [count] = counter.count([messages])
        if count == tokens:
            return messages
        words += tokens - count
    raise AssertionError(f"no chat of exactly {tokens} tokens")


def _lines(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path) if path.exists() else []


def _answered_or_rejected(out: Path, servers: tuple[str, ...], summary: dict[str, Any]) -> dict[str, Any]:
    """Every answer the servers gave counted exactly, kept or rejected; every key answered once or ledgered.

    The tiny random Qwen3 never ends its thinking: under the reasoning parser (the first server) an answer cut
    at max_tokens while thinking is rejected (check `unfinished_reasoning`) and resampled, and after
    1 + --max-resamples of them its key is ledgered `invalid`. That is the only reject and the only `invalid`
    allowed, and each reject's prompt was counted by the server as by us, as each completion's was.
    The completion lines, the rejects and the `invalid` ledger entries, by name."""
    done, kept, ledger = (_lines(out / name) for name in ("completions.jsonl", "rejected.jsonl", "failures.jsonl"))
    for r in [*done, *kept]:
        assert r["prompt_tokens"] == r["input_tokens"] > 0, r  # zero drift on every answer
    for r in kept:
        assert (r["reason"], r["check"], r["server"]) == ("invalid", "unfinished_reasoning", servers[0]), r
        assert r["finish_reason"] == "length" and r["reasoning_content"], r
    invalid = [f for f in ledger if f["reason"] == "invalid"]
    spent = Counter((r["id"], r["sample"], r.get("turn")) for r in kept)
    bound = 1 + DEFAULT_MAX_RESAMPLES
    for f in invalid:
        assert f["server"] == servers[0] and "unfinished_reasoning" in f["detail"] and f["attempts"] == bound, f
        assert spent[(f["id"], f["sample"], f.get("turn"))] == bound, f
    places = Counter((r["id"], r["sample"], r.get("turn")) for r in done)
    assert set(places.values()) <= {1} and not set(places) & {(f["id"], f["sample"], f.get("turn")) for f in invalid}
    assert summary["completed"] == len(done) and summary["token_drift"]["differed"] == 0, summary
    assert summary["token_drift"]["compared"] == len(done), summary
    return {"done": done, "kept": kept, "invalid": invalid}


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
BARE_TOOL = {"type": "function", "function": {"name": "noop"}}  # no description, no parameters: null in the dump
# No "type", the function's keys in another order, keys SGLang drops, strict kept: its dump, not the tool as given.
ODD_TOOL = {
    "function": {"parameters": {"type": "object", "properties": {}}, "strict": True, "name": "odd", "x-note": 1},
    "cache_control": {"type": "ephemeral"},
}


def shape_rows() -> list[dict[str, Any]]:
    """One row of every request shape gen-pipeline sends."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ask = [{"role": "user", "content": "weather in Paris?"}]
    history = [*ask, {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "look it up"},
               {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]}]  # fmt: skip
    rows = [
        {"prompt": "Hello, who are you?"},
        {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"}]},
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Tell me more."},
            ]
        },
        {"messages": ask, "tools": [WEATHER_TOOL]},
        {"messages": ask, "tools": [WEATHER_TOOL, TIME_TOOL]},
        {"messages": ask, "tools": [WEATHER_TOOL, TIME_TOOL, BARE_TOOL]},
        {"messages": ask, "tools": [WEATHER_TOOL, TIME_TOOL], "sampling": {"tool_choice": "none"}},
        {
            "messages": ask,
            "tools": [WEATHER_TOOL, TIME_TOOL],
            "sampling": {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        },
        {"prompt": "Hello, who are you?", "chat_template_kwargs": {"enable_thinking": False}},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hello,"}, {"type": "text", "text": "who are you?"}],
                }
            ]
        },
        {"messages": history, "tools": [WEATHER_TOOL]},
        {"messages": ask, "tools": [ODD_TOOL, WEATHER_TOOL]},
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
                {"role": "user", "content": "weather in A and B?", "name": "bob"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "A"}'},
                        },
                        {
                            "id": "b",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "B"}},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "rain"},
                {"role": "tool", "tool_call_id": "b", "content": "sun"},
            ],
            "tools": [WEATHER_TOOL],
        },
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "reasoning_content": "greet them"},
                {"role": "user", "content": "And then?"},
            ]
        },
    ]
    return [{"id": f"shape-{i}", **row} for i, row in enumerate(rows)]


def test_every_request_shape_counts_exactly(servers, write_jsonl, tmp_path):
    """Plain, system and multi-turn chats, 1-3 tools, tool_choice none and named, thinking off, text parts,
    tool-call history and earlier reasoning: every row done on both servers with zero drift; each server's
    capacity comes from the server and its prefix-cache hits are read."""
    rows = shape_rows() * 2 + prompts(8)
    rows = [{**r, "id": f"{r['id']}-{i}"} for i, r in enumerate(rows)]
    out = tmp_path / "out"
    outcome = _run(_config(write_jsonl(rows), out, servers))
    summary = outcome.summary
    seen = _answered_or_rejected(out, servers, summary)
    invalid = seen["invalid"]
    assert outcome.exit_code == 0, summary  # invalid is a permanent reason: the run is complete
    assert {r["id"] for r in seen["done"]} | {f["id"] for f in invalid} == {r["id"] for r in rows}
    assert summary["completed"] + len(invalid) == len(rows) and summary["failed"] == (
        {"invalid": len(invalid)} if invalid else {}
    )
    assert summary["token_drift"] == {"compared": len(seen["done"]), "differed": 0, "by_offset": {}}
    assert orjson.loads((out / "manifest.json").read_bytes())["server_kind"] == "sglang"
    assert_manifest_matches_servers(out, list(servers))  # model_path, weight_version, version, settings; each line's
    for url in servers:
        view = summary["servers"][url]
        answers = view["completions"] + sum((view.get("rejected") or {}).values())
        assert answers > 0 and view["capacity_source"] == "token pool"  # 8192 // 8 = 1024 < 2048
        assert view["capacity"] == 1024 and view["cached_tokens"] is not None
    assert sum(v["cached_tokens"] for v in summary["servers"].values()) > 0  # the rows share their template


def test_samples_go_through_n(servers, write_jsonl, tmp_path):
    """--samples 3: one request with n=3 per row, three completions each, counted once and exactly."""
    rows = [*shape_rows()[:4], *prompts(2)]
    out = tmp_path / "out"
    outcome = _run(_config(write_jsonl(rows), out, servers, samples=3))
    seen = _answered_or_rejected(out, servers, outcome.summary)
    done, invalid = seen["done"], seen["invalid"]
    keys = {(r["id"], r["sample"]) for r in done} | {(f["id"], f["sample"]) for f in invalid}
    assert keys == {(r["id"], s) for r in rows for s in range(3)}
    assert outcome.summary["failed"] == ({"invalid": len(invalid)} if invalid else {})
    # one request with n=3 per row; each reject but a key's last is resampled alone
    assert outcome.summary["requests"] == len(rows) + len(seen["kept"]) - len(invalid)
    assert sorted({r["sample"] for r in done}) == [0, 1, 2]


def test_whole_conversations_are_regenerated_turn_by_turn(servers, write_jsonl, tmp_path):
    """--turns all with two samples: every turn answered once by SGLang, asked with its own earlier answers,
    counted exactly; the next turns hit the prefix cache of the server that answered the last."""
    rows = conversation_rows(6)
    out = tmp_path / "out"
    outcome = _run(_config(write_jsonl(rows), out, servers, turns="all", samples=2))
    seen = _answered_or_rejected(out, servers, outcome.summary)
    invalid = seen["invalid"]
    assert outcome.exit_code == 0 and outcome.summary["failed"] == ({"invalid": len(invalid)} if invalid else {})
    lines = _regenerated_until_rejected(rows, seen, samples=2)
    later = [r for (_, _, t), r in lines.items() if t]
    assert sum(v["cached_tokens"] for v in outcome.summary["servers"].values()) > 0 and later


def _regenerated_until_rejected(rows: list[dict[str, Any]], seen: dict[str, Any], samples: int) -> dict[Any, Any]:
    """e2e.assert_regenerated, but a conversation may stop at a turn ledgered `invalid` (_answered_or_rejected):
    every (id, sample) has each of its turns once until then, and each turn, its rejects too, was asked with the
    answers recorded for the turns before it. The completion lines by key."""
    from gen_pipeline.send.turns import answer_turn, split_turns

    lines = {(r["id"], r["sample"], r["turn"]): r for r in seen["done"]}
    stops = {(f["id"], f["sample"]): f["turn"] for f in seen["invalid"]}
    assert len(lines) == len(seen["done"]) and len(stops) == len(seen["invalid"])
    for row in rows:
        for s in range(samples):
            stop = stops.get((row["id"], s), len(split_turns(row["messages"])))
            assert {t for (rid, k, t) in lines if (rid, k) == (row["id"], s)} == set(range(stop)), (row["id"], s)
    for r in [*seen["done"], *seen["kept"]]:
        rid, s, t = r["id"], r["sample"], r["turn"]
        if t:
            before = lines[(rid, s, t - 1)]
            history = [*before["messages"], answer_turn(before["completion"], before.get("reasoning_content"))]
            assert r["messages"][: len(history)] == history, (rid, s, t)
    return lines


def test_check_reports_the_real_limits(servers, write_jsonl):
    """check: context 2048, inputs under 2042, a KV pool of 8192 tokens, the scheduler's 2048 running slots from
    /v1/loads (/server_info says null) capped by the pool, and exact counts."""
    inp = write_jsonl(shape_rows())
    config = _config(inp, inp.parent / "unused", servers, max_tokens=16)
    report = asyncio.run(asyncio.wait_for(run_check(config), 300))
    assert report["ok"], report["problems"]
    for server in report["fleet"]:
        assert server["version"] == "0.5.23" and server["context_length"] == CTX
        assert server["max_req_input_len"] == MAX_INPUT and server["max_total_num_tokens"] == 8192
        assert server["max_running_requests"] == 2048
        assert (server["capacity"], server["capacity_source"]) == (8192 // 16, "token pool")
    assert report["tokenizer"]["agree"] and report["tokenizer"]["compared"] == 2 * 3
    assert "capacity 512 (token pool)" in render_check(report)


def _ledger(out: Path) -> dict[str, dict[str, Any]]:
    return {str(r["id"]): r for r in read_jsonl(out / "failures.jsonl")}


def test_a_context_told_too_large_is_budgeted_under_the_input_cap_and_prompts_over_it_unsent(
    servers, counter, write_jsonl, tmp_path
):
    """Told a larger context than the servers have: the rows that leave room are budgeted under what the
    server's scheduler makes after their input (its input cap from /server_info + 4 - input), so none gets the
    400 ("Requested token count exceeds ...", "max_completion_tokens is too large ...") and its re-budget round
    trip they got before; prompts of max_req_input_len tokens or more, which the server would refuse ("Input
    length ..." or "The input ... is longer than the model's context length"), are not sent."""
    long = _sized(counter, 2000)
    rows = [
        {"id": "input-over-context", "prompt": "word " * 3000},
        {"id": "input-at-max-input", "messages": _sized(counter, MAX_INPUT), "max_tokens": 3},
        {"id": "total-over-context", "messages": long, "max_tokens": 100},
        {"id": "max-tokens-over-context", "messages": long, "max_tokens": 5000},
    ]
    out = tmp_path / "out"
    outcome = _run(_config(write_jsonl(rows), out, servers, context_length=100_000, safety_margin=0))
    seen = _answered_or_rejected(out, servers, outcome.summary)
    invalid = {f["id"]: f for f in seen["invalid"]}
    assert outcome.summary["failed"] == {"over_length": 2, **({"invalid": len(invalid)} if invalid else {})}
    ledger = {rid: f for rid, f in _ledger(out).items() if f["reason"] == "over_length"}
    assert set(ledger) == {"input-over-context", "input-at-max-input"}
    assert all(f"the servers refuse inputs of {MAX_INPUT} tokens or more" in r["detail"] for r in ledger.values())
    done = {r["id"]: r for r in seen["done"]}
    budget = MAX_INPUT + 4 - 2000  # all the scheduler makes: max_req_len - 1 - input
    assert set(done) | set(invalid) == {"total-over-context", "max-tokens-over-context"}
    for r in done.values():
        assert r["prompt_tokens"] == 2000 and r["attempts"] == 1
        assert r["max_tokens"] == budget and r["completion_tokens"] <= r["max_tokens"]
    for r in seen["kept"]:  # sent with the same budget (the ledger entry says which)
        assert r["prompt_tokens"] == 2000 and r["completion_tokens"] <= budget == invalid[r["id"]]["max_tokens"]
    assert outcome.summary["requests"] == len(done) + len(seen["kept"])  # no 400, no re-budget round trip


# The simulator follows the real server: the same requests to both, compared.


def _probe_requests(counter) -> list[dict[str, Any]]:
    """Chat bodies of every shape and of every limit, each answered alike by SGLang 0.5.23 and the simulator."""
    rows = shape_rows()
    bodies: list[dict[str, Any]] = []
    for row in rows:
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        extra = {k: row[k] for k in ("tools", "chat_template_kwargs") if k in row}
        bodies.append({"messages": messages, "max_tokens": 1, **extra, **row.get("sampling", {})})
    limits = [
        (_sized(counter, 3000), 1),  # input over the context
        (_sized(counter, 2000), 100),  # input + max_tokens over the context
        (_sized(counter, 10), 5000),  # max_tokens over the context
        (_sized(counter, MAX_INPUT), 1),  # input at max_req_input_len
        (_sized(counter, MAX_INPUT - 1), 1),  # just under it
        (_sized(counter, 2030), 18),  # input + max_tokens == context: accepted
        (_sized(counter, 10), -1),  # a negative budget
    ]
    bodies += [{"messages": m, "max_tokens": n} for m, n in limits]
    bodies.append({**bodies[0], "n": 3, "max_tokens": 2})
    return [{"model": "tiny-qwen3", **b} for b in bodies]


async def _answers(url: str, bodies: list[dict[str, Any]]) -> tuple[list[tuple[int, Any, Any]], dict[str, Any]]:
    """(status, error text, prompt_tokens) per body, and the info endpoints' bodies."""
    import aiohttp

    answers, info = [], {}
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                got = await resp.json()
                usage = got.get("usage") or {}
                answers.append((resp.status, got.get("message"), usage.get("prompt_tokens")))
        for path in ("/get_server_info", "/get_model_info", "/v1/loads", "/v1/models"):
            async with session.get(url + path) as resp:
                info[path] = await resp.json()
    return answers, info


SERVER_INFO_KEYS = ("context_length", "max_total_num_tokens", "max_req_input_len", "version", "max_running_requests")
SERVER_INFO_KEYS += ("model_path", "weight_version", *OUTPUT_SETTINGS)  # what provenance records


def test_the_simulator_answers_as_the_real_server(servers, counter):
    """Every shape and every limit: the same status, error text and prompt_tokens from the simulator as from
    SGLang 0.5.23, and the same figures from its info endpoints."""
    from gen_pipeline.sim import SimConfig, start_fleet

    bodies = _probe_requests(counter)
    sim = SimConfig(ports=tuple(free_ports(1)), context_length=CTX, explicit_context_length=True, tokenizer=str(MODEL),
                    model="tiny-qwen3", max_total_tokens=8192, max_running=2048, cache_report=True,
                    health_delay=0.0)  # fmt: skip

    async def both() -> tuple[Any, Any]:
        async with await start_fleet(sim) as fleet:
            simulated = await _answers(fleet.urls[0], bodies)
        return await _answers(servers[1], bodies), simulated

    (real, real_info), (simulated, sim_info) = asyncio.run(asyncio.wait_for(both(), 600))
    for body, r, s in zip(bodies, real, simulated, strict=True):
        assert s == r, f"{str(body)[:200]}: real {r}, simulated {s}"
    for key in SERVER_INFO_KEYS:
        assert sim_info["/get_server_info"][key] == real_info["/get_server_info"][key], key
    state = ("context_length", "max_running_requests", "effective_max_running_requests_per_dp")
    real_state, sim_state = (i["/get_server_info"]["internal_states"][0] for i in (real_info, sim_info))
    assert {k: sim_state[k] for k in state} == {k: real_state[k] for k in state}
    assert list(sim_info["/get_model_info"]) == list(real_info["/get_model_info"])
    for key in ("model_path", "weight_version", "served_model_name"):
        assert sim_info["/get_model_info"][key] == real_info["/get_model_info"][key], key
    [real_load], [sim_load] = real_info["/v1/loads"]["loads"], sim_info["/v1/loads"]["loads"]
    assert set(sim_load) <= set(real_load)
    for key in ("max_running_requests", "max_total_num_tokens", "num_running_reqs", "num_waiting_reqs"):
        assert sim_load[key] == real_load[key], key
    [real_card], [sim_card] = real_info["/v1/models"]["data"], sim_info["/v1/models"]["data"]
    assert {**sim_card, "created": 0} == {**real_card, "created": 0}


async def _events(url: str, body: dict[str, Any]) -> list[Any]:
    """The data of each event of one streamed chat request, as sent ("[DONE]" as that string)."""
    import aiohttp

    events: list[Any] = []
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        async for line in resp.content:
            if line.startswith(b"data: "):
                data = line[6:].strip()
                events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


def _kinds(events: list[Any], index: int) -> list[tuple[Any, ...]]:
    """The shapes of choice `index`'s events, in order, and of the usage event and [DONE]: each event's keys and
    its choice's delta keys and finish_reason (a run of alike content chunks is one shape). Text and ids left
    out: a random model says what it says."""
    shapes: list[tuple[Any, ...]] = []
    for event in events:
        if event == "[DONE]":
            shape: tuple[Any, ...] = ("[DONE]",)
        elif not event["choices"]:
            shape = (tuple(sorted(event)), "usage", tuple(event["usage"]))
        elif event["choices"][0]["index"] != index:
            continue
        else:
            [choice] = event["choices"]
            delta = tuple(k for k, v in choice["delta"].items() if k != "content" or v)  # SGLang sends "" too
            shape = (tuple(sorted(event)), delta, choice["finish_reason"] is not None, tuple(sorted(choice)))
        if not shapes or shapes[-1] != shape:
            shapes.append(shape)
    return shapes


def test_the_simulator_streams_as_the_real_server(servers):
    """A streamed chat (n 1 and 2, with the usage chunk): the simulator sends the same event shapes in the same
    order per choice as SGLang 0.5.23: the role first, content deltas, the finish chunk, the usage, [DONE]."""
    from gen_pipeline.sim import SimConfig, start_fleet

    sim = SimConfig(ports=tuple(free_ports(1)), context_length=CTX, tokenizer=str(MODEL), model="tiny-qwen3",
                    cache_report=True, health_delay=0.0)  # fmt: skip
    body = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip

    async def both(n: int) -> tuple[list[Any], list[Any]]:
        async with await start_fleet(sim) as fleet:
            simulated = await _events(fleet.urls[0], {**body, "n": n})
        return await _events(servers[1], {**body, "n": n}), simulated

    for n in (1, 2):
        real, simulated = asyncio.run(asyncio.wait_for(both(n), 300))
        for index in range(n):
            assert _kinds(simulated, index) == _kinds(real, index), f"n={n}, choice {index}"


def test_a_stopped_stream_frees_its_slot_and_the_server_goes_on(servers):
    """A streamed request of 1,500 tokens stopped by its reader after 5 chunks (as the loop guard stops one):
    the client closes its connection and aborts it by its rid; /v1/loads counts no running request within
    seconds (it would decode for minutes), and the server answers the next request whole."""
    from gen_pipeline.errors import DegenerateAnswerError
    from gen_pipeline.http import Client, open_transport

    url = servers[1]
    seen: list[str] = []

    def watch(index: int, content: str, reasoning: str) -> None:
        seen.append(content)
        if len(seen) >= 5:
            raise DegenerateAnswerError("stopped by the test", check="loop", content="".join(seen))

    async def scenario() -> tuple[list[int], float, Any]:
        async with open_transport() as transport:
            client = Client(transport, stream=True)
            body = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "Go on."}], "max_tokens": 1500,
                    "rid": f"gp-realserver-{os.getpid()}."}  # fmt: skip
            with pytest.raises(DegenerateAnswerError):
                await client.chat(url, body, 600, watch)
            stopped = asyncio.get_running_loop().time()
            running = []
            while asyncio.get_running_loop().time() - stopped < 20:
                running.append((await client.get_json(url, "/v1/loads"))["loads"][0]["num_running_reqs"])
                if running[-1] == 0:
                    break
                await asyncio.sleep(0.1)
            freed = asyncio.get_running_loop().time() - stopped
            after = await client.chat(url, {**body, "max_tokens": 4, "rid": f"gp-realserver-{os.getpid()}-2."}, 300)
            return running, freed, after

    running, freed, after = asyncio.run(asyncio.wait_for(scenario(), 600))
    assert running[-1] == 0 and freed < 5, running
    assert after.finish_reason == "length" and after.completion_tokens == 4 and after.prompt_tokens


def test_a_run_streams_through_the_loop_guard_with_exact_usage(servers, write_jsonl, tmp_path):
    """The default run streams (--loop-guard on): every row done, the usage the stream ends with (prompt and
    completion tokens) the same as a whole answer's, and the lines' weights the server's. On the server without a
    reasoning parser: a random model never ends its thinking, which the answer checks reject."""
    rows = prompts(12)
    out = {guard: tmp_path / guard for guard in ("on", "off")}
    for guard, where in out.items():
        config = _config(write_jsonl(rows, f"{guard}.jsonl"), where, servers[1:], loop_guard=guard, max_tokens=6)
        outcome = _run(config)
        assert outcome.exit_code == 0, outcome.summary
    lines = {guard: {r["id"]: r for r in read_jsonl(where / "completions.jsonl")} for guard, where in out.items()}
    assert set(lines["on"]) == set(lines["off"]) == {r["id"] for r in rows}
    for key, streamed in lines["on"].items():
        whole = lines["off"][key]
        assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (whole["prompt_tokens"], 6)
        assert streamed["input_tokens"] == whole["input_tokens"] and streamed["weight_version"] == "default"
