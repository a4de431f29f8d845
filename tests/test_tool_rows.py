"""Tool-use rows keep everything the model saw: the request's tools, template kwargs and sampling, every
turn's tool calls, ids, names and reasoning, and the answer's own tool calls; in the output line and in
every exported row shape (issue 29, item 4)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest
from e2e import WEATHER_TOOL, read_jsonl, run_sim, shape_rows
from test_answers import fleet

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.export.export import ExportConfig, export
from gen_pipeline.modes import run_async

CALL = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def _present(turn: dict[str, Any]) -> dict[str, Any]:
    """An exported turn without its null fields."""
    out = {k: v for k, v in turn.items() if v is not None}
    if "tool_calls" in out:
        out["tool_calls"] = [{k: v for k, v in c.items() if v is not None} for c in out["tool_calls"]]
    return out


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A run over the tool-use shapes, rows with their own sampling, and a seed: its directory and rows."""
    tmp = tmp_path_factory.mktemp("tools")
    rows = shape_rows(8)
    rows[0]["sampling"] = {"temperature": 0.3, "stop": ["\n\n"]}
    rows[3]["messages"][2]["name"] = "get_weather"
    path = tmp / "in.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    outcome, _ = run_sim(path, tmp / "run", sampling={"seed": 7, "top_p": 0.9}, samples=2)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 16
    return tmp / "run", rows


def test_the_output_line_holds_what_the_request_carried(shapes_run):
    """tools, chat_template_kwargs and sampling (with each sample's own seed) are in the line, and the
    history keeps its tool calls, tool-call ids, names and reasoning as sent."""
    run, rows = shapes_run
    by_key = {(r["id"], r["sample"]): r for r in read_jsonl(run / "completions.jsonl")}
    for row in rows:
        first, second = by_key[(row["id"], 0)], by_key[(row["id"], 1)]
        assert first["messages"] == row.get("messages", [{"role": "user", "content": row.get("prompt")}])
        assert first.get("tools") == row.get("tools")
        assert first.get("chat_template_kwargs") == row.get("chat_template_kwargs")
        assert {k: v for k, v in first["sampling"].items() if k != "seed"} == {"top_p": 0.9, **row.get("sampling", {})}
        assert first["sampling"]["seed"] != second["sampling"]["seed"]  # each sample's own, as sent
    assert by_key[("shape-3", 0)]["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_the_exported_row_holds_what_the_model_saw(shapes_run, tmp_path):
    """Per sample, grouped and saved to disk: every turn's fields and the request's, nothing dropped."""
    run, _ = shapes_run
    export(ExportConfig(runs=(run,), out=tmp_path / "ds", save_to_disk=True))
    ds = {(r["id"], r["sample"]): r for r in datasets.load_from_disk(str(tmp_path / "ds"))}
    tool_row = ds[("shape-3", 0)]
    assert orjson.loads(tool_row["tools"]) == [WEATHER_TOOL]
    turns = [_present(m) for m in tool_row["messages"]]
    assert turns[1] == {
        "role": "assistant",
        "reasoning_content": "look it up",
        "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "C3"}'}}
        ],
    }
    assert turns[2] == {"role": "tool", "tool_call_id": "c3", "name": "get_weather", "content": "sunny"}
    assert turns[-1]["role"] == "assistant" and turns[-1]["content"]
    assert orjson.loads(ds[("shape-1", 0)]["chat_template_kwargs"]) == {"enable_thinking": True}
    assert _present(ds[("shape-2", 0)]["messages"][0])["content"] == "part 2 two"  # as SGLang joins text parts
    assert orjson.loads(ds[("shape-0", 1)]["sampling"])["temperature"] == 0.3
    export(ExportConfig(runs=(run,), out=tmp_path / "g", save_to_disk=True, group_samples=True))
    grouped = {r["id"]: r for r in datasets.load_from_disk(str(tmp_path / "g"))}
    assert orjson.loads(grouped["shape-3"]["tools"]) == [WEATHER_TOOL]
    assert _present(grouped["shape-3"]["messages"][1])["tool_calls"][0]["id"] == "c3"
    assert len(grouped["shape-3"]["sampling"]) == 2 and len(grouped["shape-3"]["completions"]) == 2


def test_an_answer_that_calls_a_tool_is_kept_with_its_calls(write_jsonl, tmp_path):
    """A 200 whose message has tool_calls and no content is a completion (it was empty_completion): its
    line and its exported assistant turn carry the calls and the thinking."""
    answer = {"message": {"content": None, "reasoning_content": "need the weather", "tool_calls": [CALL]}}
    rows = [
        {"id": i, "messages": [{"role": "user", "content": f"weather {i}?"}], "tools": [WEATHER_TOOL]} for i in range(4)
    ]
    out = tmp_path / "out"

    async def go() -> Any:
        async with fleet([answer], good=0) as urls:
            config = RunConfig(
                input=write_jsonl(rows),
                out=out,
                servers=tuple(urls),
                retry=RetryPolicy.testing(),
                progress="off",
                max_tokens=32,
            )
            return await run_async(config)

    outcome = asyncio.run(asyncio.wait_for(go(), 60))
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 4
    line = read_jsonl(out / "completions.jsonl")[0]
    assert line["tool_calls"] == [CALL] and line["completion"] == "" and line["reasoning_content"] == "need the weather"
    export(ExportConfig(runs=(out,), out=tmp_path / "ds", save_to_disk=True))
    last = _present(datasets.load_from_disk(str(tmp_path / "ds"))[0]["messages"][-1])
    assert last == {"role": "assistant", "content": "", "reasoning_content": "need the weather", "tool_calls": [CALL]}
