"""Everything the server's template sees reaches our count (issue 19): tools, chat_template_kwargs,
content parts and tool-call turns, against the SGLang simulator counting with transformers."""

from __future__ import annotations

import asyncio
from collections import Counter
from hashlib import blake2b
from typing import Any

import orjson
import pytest
from conftest import QWEN3
from e2e import read_jsonl

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.engine.recorder import cut_by_server
from gen_pipeline.errors import ConfigError, ManifestMismatchError
from gen_pipeline.inputs.rows import RowError, parse_row
from gen_pipeline.modes import run_async
from gen_pipeline.options import build_config
from gen_pipeline.preflight.check import run_check
from gen_pipeline.records import Completion
from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.tokens import load_counter
from gen_pipeline.tokens.conversation import Conversation
from gen_pipeline.tokens.findings import TEMPLATE_BLAME, drift_cause

CTX = 4096
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def mixed_rows() -> list[dict[str, Any]]:
    """Rows of every shape: plain, top-level tools, row and sampling template kwargs, content parts,
    tool-call history; plus two the servers would refuse."""
    rows: list[dict[str, Any]] = []
    for i in range(6):
        rows.append({"id": f"plain-{i}", "prompt": f"question {i} about rivers"})
        rows.append({"id": f"tools-{i}", "messages": [user(f"weather {i}?")], "tools": [WEATHER]})
        rows.append({"id": f"think-{i}", "prompt": f"think {i}", "chat_template_kwargs": {"enable_thinking": True}})
        rows.append({"id": f"samp-{i}", "prompt": f"s {i}", "sampling": {"chat_template_kwargs": {"x": 1}}})
        parts = [{"type": "text", "text": f"part {i}"}, {"type": "input_text", "text": "and more"}]
        rows.append({"id": f"parts-{i}", "messages": [user(parts)]})
        history = [
            user(f"Weather in Paris, {i}?"),
            {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "call it"},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
        ]
        rows.append({"id": f"calls-{i}", "messages": history, "tools": [WEATHER, CLOCK]})
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    rows.append({"id": "image", "messages": [user([image])]})
    rows.append({"id": "badtools", "prompt": "x", "tools": {"name": "f"}})
    return rows


@pytest.fixture
def qwen3() -> str:
    if not (QWEN3 / "tokenizer.json").exists():
        pytest.skip(f"the real Qwen3 tokenizer (its template renders tools and enable_thinking) is not at {QWEN3}")
    return str(QWEN3)


async def _plan_then_generate(config: RunConfig, qwen3: str) -> tuple[dict[str, Any], Any, int]:
    ports = tuple(free_ports(2))
    sim = SimConfig(ports=ports, health_delay=0.0, context_length=CTX, tokenizer=qwen3)
    async with await start_fleet(sim) as fleet:
        config = RunConfig(**{**config.__dict__, "servers": tuple(fleet.urls)})
        report = await run_check(config)
        outcome = await run_async(config)
        return report, outcome, sum(s.length_errors for s in fleet.stats.values())


def test_every_shape_is_counted_exactly_and_planned_as_generated(write_jsonl, tmp_path, qwen3):
    """Every valid row done with 0 drift and 0 context 400s; the two bad rows ledgered with their reason;
    check's plan equals the run (the global kwargs go to rows without their own)."""
    tools = tmp_path / "tools.json"
    tools.write_bytes(orjson.dumps([CLOCK]))
    config = build_config(
        write_jsonl(mixed_rows()),
        tmp_path / "run",
        servers="127.0.0.1:1",
        tokenizer=qwen3,
        chat_template_kwargs='{"enable_thinking": false}',
        tools=str(tools),
        max_tokens=64,
        progress="off",
    )
    config = RunConfig(**{**config.__dict__, "retry": RetryPolicy.testing()})
    report, outcome, length_errors = asyncio.run(asyncio.wait_for(_plan_then_generate(config, qwen3), 120))
    assert outcome.exit_code == 0, outcome.summary
    done = read_jsonl(tmp_path / "run" / "completions.jsonl")
    assert len(done) == outcome.summary["completed"] == 36 and length_errors == 0
    assert outcome.summary["token_drift"] == {"compared": 36, "differed": 0, "by_offset": {}}
    ledger = {r["id"]: r["detail"] for r in read_jsonl(tmp_path / "run" / "failures.jsonl")}
    assert ledger.keys() == {"image", "badtools"}
    assert "multimodal content is not supported" in ledger["image"] and "tools must be a list" in ledger["badtools"]
    counted = {r["id"]: r["input_tokens"] for r in done}
    # rows without their own get the run's tools and kwargs; a row's own value replaces the run's
    expect = load_counter(qwen3).count(
        [
            Conversation([user("question 0 about rivers")], [CLOCK], {"enable_thinking": False}),
            Conversation([user("weather 0?")], [WEATHER], {"enable_thinking": False}),
            Conversation([user("think 0")], [CLOCK], {"enable_thinking": True}),
        ]
    )
    assert [counted["plain-0"], counted["tools-0"], counted["think-0"]] == expect
    plan = report["plan"]
    assert report["ok"], report["problems"]
    assert (plan["prompts"], plan["bad_input"]) == (36, 2)
    assert plan["input_tokens"] == outcome.summary["input_tokens"] == sum(counted.values())
    assert plan["output_budget"] == sum(r["max_tokens"] for r in done)
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["server_kind"] == "sglang" and manifest["template_inputs_sha256"]


def test_a_resume_with_other_template_inputs_is_refused(write_jsonl, tmp_path):
    """--chat-template-kwargs is in the manifest: another value is refused like another template."""
    from gen_pipeline.engine.setup import manifest_for
    from gen_pipeline.rundir.store import check_manifest
    from gen_pipeline.tokens import FolderTemplate

    identity = FolderTemplate("tok", "{{ messages }}")
    configs = [build_config("in", tmp_path, chat_template_kwargs=kw) for kw in ('{"a": 1}', '{"a": 2}')]
    check_manifest(tmp_path, manifest_for(configs[0], "m", CTX, identity), force=False)
    check_manifest(tmp_path, manifest_for(configs[0], "m", CTX, identity), force=False)  # the same: fine
    with pytest.raises(ManifestMismatchError, match="template_inputs_sha256"):
        check_manifest(tmp_path, manifest_for(configs[1], "m", CTX, identity), force=False)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"prompt": "x", "tools": [WEATHER], "chat_template_kwargs": {"a": 1}}, ([WEATHER], {"a": 1}, None)),
        ({"prompt": "x", "sampling": {"tools": [WEATHER], "top_k": 2}}, ([WEATHER], None, {"top_k": 2})),
        ({"prompt": "x", "sampling": {"chat_template_kwargs": {"a": 1}}}, (None, {"a": 1}, {})),
    ],
)
def test_rows_carry_their_template_inputs(row, expected):
    """Top-level and sampling tools/kwargs become the row's own (lifted out of sampling, so counted)."""
    p = parse_row(orjson.dumps(row), 1)
    assert (p.tools, p.template_kwargs, p.sampling) == expected
    assert "tools" not in p.meta and "chat_template_kwargs" not in p.meta


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "x", "tools": "f"}, "tools must be a list"),
        ({"prompt": "x", "chat_template_kwargs": [1]}, "chat_template_kwargs must be an object"),
        ({"prompt": "x", "tools": [WEATHER], "sampling": {"tools": [CLOCK]}}, "both at the top level"),
        ({"messages": [user([{"type": "input_audio", "input_audio": {}}])]}, "multimodal content is not supported"),
        ({"messages": [{"role": "user", "content": None}]}, "content must be a string or text parts"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]}, "on an assistant turn"),
        ({"messages": [user([])]}, "content is empty"),
    ],
)
def test_rows_the_servers_refuse_are_bad_input(row, reason):
    """Bad template inputs and shapes are a RowError (a bad_input ledger entry) with the reason."""
    with pytest.raises(RowError, match=reason):
        parse_row(orjson.dumps(row), 1)


def test_message_shapes_servers_accept_are_accepted():
    """Text parts, an assistant turn with tool calls and null content, a tool turn, reasoning and name."""
    row = {"messages": mixed_rows()[5]["messages"] + [{"role": "user", "content": "ok", "name": "bob"}]}
    p = parse_row(orjson.dumps(row), 1)
    assert p.messages == row["messages"] and p.derived_id


def test_derived_ids_see_tool_calls_and_template_inputs():
    """Rows that differ only in tool-call arguments or tools get different derived ids (not dropped as repeats)."""
    history = mixed_rows()[5]["messages"]
    other = orjson.loads(orjson.dumps(history).replace(b"Paris", b"Rome", 1))
    ids = {parse_row(orjson.dumps(r), 1).id for r in ({"messages": history}, {"messages": other})}
    with_tools = parse_row(orjson.dumps({"messages": history, "tools": [WEATHER]}), 1).id
    plain = parse_row(orjson.dumps({"prompt": "hello"}), 1).id
    assert len(ids | {with_tools}) == 3
    assert plain == "h" + blake2b(b'[["user","hello"]]', digest_size=16).hexdigest()[:24]  # plain ids unchanged


def test_global_inputs_from_flags_and_sampling():
    """--sampling's tools/chat_template_kwargs act as the flags; both at once with other values is refused."""
    config = build_config("in", "out", sampling='{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 5}')
    assert (config.chat_template_kwargs, config.sampling) == ({"enable_thinking": False}, {"top_k": 5})
    with pytest.raises(ConfigError, match="keep one"):
        build_config("in", "out", sampling='{"chat_template_kwargs": {"a": 1}}', chat_template_kwargs='{"a": 2}')
    with pytest.raises(ConfigError, match="must be a JSON object"):
        build_config("in", "out", chat_template_kwargs="[1]")


def test_drift_names_the_request_shape_that_explains_it():
    """Rows with tools drift and rows without agree: the message names tools, not the tokenizer."""
    shapes = Counter({"tools": 4, "tools drifted": 4, "content parts": 3, "content parts drifted": 1})
    assert "rows with tools (4 of 4 such rows differed, none of the 6 without)" in drift_cause(shapes, 10, 4)
    assert drift_cause(Counter({"tools": 4, "tools drifted": 2}), 10, 5) == TEMPLATE_BLAME  # plain rows drift too
    assert "tools (on every row)" in drift_cause(Counter({"tools": 10, "tools drifted": 3}), 10, 3)


@pytest.mark.parametrize(
    ("finish", "used", "sent", "cut"),
    [("length", 40, 64, True), ("length", 64, 64, False), ("stop", 10, 64, False), ("length", None, 64, False)],
)
def test_an_answer_cut_before_its_max_tokens_is_recognised(finish, used, sent, cut):
    """finish_reason length with fewer completion tokens than sent: the server cut it at its context."""
    done = Completion("a", [], "x", finish, 10, 10, used, sent, "s", 1, 0.0, "m", {})
    assert cut_by_server(done) is cut
