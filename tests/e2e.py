"""Helpers for end-to-end tests: a simulated fleet and a generate run in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.engine.summary import Outcome
from gen_pipeline.modes import run_async
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.sim import SimConfig, free_ports, start_fleet

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def shape_rows(n: int) -> list[dict[str, Any]]:
    """`n` rows of the shapes real servers take (issue 19): top-level tools, their own template kwargs,
    text parts, and tool-call history (null content, string arguments, a tool turn, earlier reasoning)."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "C{i}"}}'},
        }
        shapes = [
            {"messages": [{"role": "user", "content": f"weather in town {i}?"}], "tools": [WEATHER_TOOL]},
            {"prompt": f"think about {i}", "chat_template_kwargs": {"enable_thinking": True}},
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": f"part {i}"}, {"type": "text", "text": "two"}],
                    }
                ]
            },
            {
                "messages": [
                    {"role": "user", "content": f"weather in C{i}?"},
                    {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "look it up"},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": [{"type": "text", "text": "sunny"}]},
                ],
                "tools": [WEATHER_TOOL],
            },
        ]
        rows.append({"id": f"shape-{i}", **shapes[i % len(shapes)]})
    return rows


SYSTEM = {"role": "system", "content": "be brief"}


def conversation_rows(n: int, turns: int = 3, start: int = 0) -> list[dict[str, Any]]:
    """`n` conversations of `turns` user turns, each with the original model's assistant turns."""
    rows = []
    for i in range(start, start + n):
        messages: list[dict[str, Any]] = [SYSTEM]
        for t in range(turns + i % 2):
            messages.append({"role": "user", "content": f"c{i} question {t}: " + "tell me " * (1 + (i + t) % 5)})
            messages.append({"role": "assistant", "content": f"ORIGINAL answer {i}.{t}"})
        rows.append({"id": f"c{i}", "messages": messages})
    return rows


def prompts(n: int, words: int = 20, start: int = 0) -> list[dict[str, Any]]:
    """`n` distinct chat rows of varying length."""
    return [
        {
            "id": i,
            "messages": [{"role": "user", "content": f"Q{i}: " + "tell me more " * (1 + (i * 7) % words)}],
        }
        for i in range(start, start + n)
    ]


async def run_against_sim(
    input_path: Path, out: Path, sim: dict[str, Any] | None = None, **run: Any
) -> tuple[Outcome, Any]:
    """Start a simulated fleet (8 ports unless told), run generate against it, return both."""
    sim = {"health_delay": 0.0, **(sim or {})}
    n = sim.pop("n_ports", 8)
    ports = tuple(free_ports(n))
    per_port = sim.pop("per_port", None)  # a function of the ports, for faults that name ports
    config = SimConfig(ports=ports, **sim, **(per_port(ports) if per_port else {}))
    async with await start_fleet(config) as fleet:
        settings = {"retry": RetryPolicy.testing(), "progress": "off", "max_tokens": 64, **run}
        cfg = RunConfig(input=input_path, out=out, servers=tuple(fleet.urls), **settings)
        outcome = await run_async(cfg)
        return outcome, fleet


@contextlib.contextmanager
def fleet_in_thread(config: SimConfig) -> Iterator[str]:
    """A simulated fleet served by its own event loop in a thread; yields the --servers value."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fleet = asyncio.run_coroutine_threadsafe(start_fleet(config), loop).result(30)
    try:
        yield ",".join(fleet.urls)
    finally:
        asyncio.run_coroutine_threadsafe(fleet.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def run_sim(input_path: Path, out: Path, sim: dict[str, Any] | None = None, timeout: float = 60, **run: Any):
    """Synchronous wrapper with a deadline."""
    return asyncio.run(asyncio.wait_for(run_against_sim(input_path, out, sim, **run), timeout))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def check_invariant(input_ids: list[Any], out: Path) -> dict[str, Any]:
    """Every id once in the output, or else in the ledger; never twice in the output (all shard files)."""
    done = Counter(str(r["id"]) for path in RunDir(out).completion_files() for r in read_jsonl(path))
    dupes = {k: v for k, v in done.items() if v > 1}
    ledger = {str(r["id"]) for path in RunDir(out).failure_files() for r in read_jsonl(path) if r["id"] is not None}
    lost = [i for i in map(str, input_ids) if i not in done and i not in ledger]
    assert not dupes, f"duplicated ids in output: {dupes}"
    assert not lost, f"ids neither in output nor ledger: {lost[:10]}"
    return {"done": len(done), "ledger": len(ledger)}


def replace(cfg: Any, **kw: Any) -> Any:
    return dataclasses.replace(cfg, **kw)


def assert_regenerated(rows: list[dict[str, Any]], out: Path, samples: int) -> dict[tuple[Any, int, int], Any]:
    """A `--turns all` run's lines: every (id, sample, turn) once, each turn asked with the answers recorded
    for the turns before it, and counted as the server counted it. The lines by key."""
    from gen_pipeline.send.turns import answer_turn, split_turns

    done = [r for path in RunDir(out).completion_files() for r in read_jsonl(path)]
    lines = {(r["id"], r["sample"], r["turn"]): r for r in done}
    assert len(lines) == len(done) == samples * sum(len(split_turns(r["messages"])) for r in rows)
    for (rid, s, t), r in lines.items():
        assert r["prompt_tokens"] == r["input_tokens"], (rid, s, t)
        if t:
            before = lines[(rid, s, t - 1)]
            history = [*before["messages"], answer_turn(before["completion"], before.get("reasoning_content"))]
            assert r["messages"][: len(history)] == history, (rid, s, t)
    return lines
