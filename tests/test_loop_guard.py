"""--loop-guard on a simulated fleet whose answers sometimes loop: the loops are stopped while they decode (on
the server too) and none reaches the output; the simulator's loop fault is seeded and reproducible."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline.answers.loops import LoopDetector
from gen_pipeline.cli import generate as generate_cli
from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.errors import ConfigError
from gen_pipeline.modes import run_async
from gen_pipeline.sim import PortStats, SimConfig, add_arguments, free_ports, start_fleet
from gen_pipeline.sim import choices as sim_choices
from gen_pipeline.sim.cli import config_from_args

ROWS = 60


def loops(text: str) -> bool:
    """Whether the loop detector finds a loop in `text`, fed as a stream feeds it."""
    detector = LoopDetector()
    return any(detector.feed(text[i : i + 4]) for i in range(0, len(text), 4))


def draw(cfg: SimConfig, keys: int) -> list[sim_choices.Choice]:
    return [sim_choices.generate_choice(b"row %d" % i, cfg, 400, (), 2, None) for i in range(keys)]


def test_the_loop_fault_is_seeded_and_runs_to_max_tokens() -> None:
    """About p_loop of the answers loop (the same ones for the same seed, others for another): they repeat a
    unit of up to loop_period words from a drawn point to max_tokens ("length"); with reasoning on, some loop in
    the thinking and leave the content empty."""
    cfg = SimConfig(ports=(1,), p_loop=0.2, loop_period=30, reasoning_words=20)
    made = draw(cfg, 500)
    looping = [c for c in made if c.loop_tokens]
    assert 70 <= len(looping) <= 130
    assert [c.loop_tokens for c in draw(cfg, 500)] == [c.loop_tokens for c in made]
    other = draw(SimConfig(ports=(1,), p_loop=0.2, loop_period=30, reasoning_words=20, seed=1), 500)
    assert [bool(c.loop_tokens) for c in other] != [bool(c.loop_tokens) for c in made]
    for c in looping:
        gen = c.answer if c.answer.loop_tokens else c.thought
        assert gen is not None and gen.finish_reason == "length" and c.tokens == 400
        assert loops(gen.text) and len(gen.text.split()) == gen.tokens
    in_thinking = [c for c in looping if c.thought is not None and c.thought.loop_tokens]
    assert in_thinking and all(c.answer.text == "" for c in in_thinking)
    assert not any(loops(c.answer.text) for c in made if not c.loop_tokens)


def test_the_simulator_flags_set_the_loop_fault_and_the_stream_interval() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--ports", "31000", "--p-loop", "0.05", "--loop-period", "12", "--stream-interval", "4"])
    cfg = config_from_args(args)
    assert (cfg.p_loop, cfg.loop_period, cfg.stream_interval) == (0.05, 12, 4)
    with pytest.raises(ConfigError):
        SimConfig(ports=(1,), p_loop=1.5)


async def _night(inp: Path, out: Path, guard: str, **sim: Any) -> tuple[Any, PortStats]:
    cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, p_loop=0.2, completion_words=60, **sim)
    async with await start_fleet(cfg) as fleet:
        config = RunConfig(
            input=inp,
            out=out,
            servers=tuple(fleet.urls),
            retry=RetryPolicy.testing(),
            progress="off",
            max_tokens=3000,
            loop_guard=guard,
            sampling={"seed": 7},  # a resample is another draw
        )
        outcome = await run_async(config)
        await asyncio.sleep(0.2)  # the aborts sent in the background land
        return outcome, fleet.stats[cfg.ports[0]]


def night(write_jsonl: Any, tmp_path: Path, guard: str, **sim: Any) -> tuple[Any, PortStats, list[dict[str, Any]]]:
    rows = [{"id": i, "messages": [{"role": "user", "content": f"question number {i}"}]} for i in range(ROWS)]
    out = tmp_path / f"run-{guard}"
    outcome, stats = asyncio.run(asyncio.wait_for(_night(write_jsonl(rows), out, guard, **sim), 120))
    lines = [orjson.loads(line) for line in (out / "completions.jsonl").read_bytes().splitlines()]
    return outcome, stats, lines


@pytest.mark.parametrize(
    "sim",
    [{"token_latency": 0.0005}, {"token_latency": 0.0005, "reasoning_words": 40}, {"token_latency": 0.0}],
    ids=["content", "thinking", "instant"],
)
def test_with_the_guard_no_loop_reaches_the_output_and_the_loops_are_cut_short(
    write_jsonl: Any, tmp_path: Path, sim: dict[str, Any]
) -> None:
    """A fifth of the answers loop to 3,000 tokens. Guard off: they are written as ordinary rows and most of
    the decoding is loops. Guard on: none is written; each loop was aborted by its rid after under 400 tokens
    (a loop's 3,000 without the guard), kept in rejected.jsonl and resampled; a row whose every draw loops is
    ledgered "degenerate"."""
    _, off_stats, off_lines = night(write_jsonl, tmp_path, "off", **sim)
    _, on_stats, on_lines = night(write_jsonl, tmp_path, "on", **sim)
    looped = [r for r in off_lines if loops(r["completion"]) or loops(r.get("reasoning_content") or "")]
    assert len(looped) >= 5 and off_stats.loop_tokens > 0.5 * off_stats.decoded_tokens
    assert not [r for r in on_lines if loops(r["completion"]) or loops(r.get("reasoning_content") or "")]
    run = tmp_path / "run-on"
    failures = [orjson.loads(line) for line in (run / "failures.jsonl").read_bytes().splitlines()]
    rejected = [orjson.loads(line) for line in (run / "rejected.jsonl").read_bytes().splitlines()]
    assert len(on_lines) + len(failures) == ROWS and all(f["reason"] == "degenerate" for f in failures)
    assert len(rejected) >= len(looped) and {r["reason"] for r in rejected} == {"degenerate"}
    assert on_stats.aborts == len(rejected)
    if sim["token_latency"]:  # a port that decodes instantly has sent the whole loop before the guard sees it
        assert on_stats.stopped == len(rejected) and on_stats.loop_tokens < 400 * len(rejected)
        assert off_stats.loop_tokens > 2000 * len(looped)  # a loop runs its 3,000 tokens, less its head
    for guard in ("on", "off"):
        assert orjson.loads((tmp_path / f"run-{guard}" / "manifest.json").read_bytes())["loop_guard"] == guard


def test_the_flag_reaches_the_run_and_its_manifest(tmp_path: Path) -> None:
    """--loop-guard on|off (default on) is a RunConfig field (the runs above find it in their manifest);
    anything else is refused."""
    parser = argparse.ArgumentParser()
    generate_cli.add_arguments(parser)
    base = ["--input", "x.jsonl", "--out", str(tmp_path)]
    assert generate_cli.config_from_args(parser.parse_args(base)).loop_guard == "on"
    config = generate_cli.config_from_args(parser.parse_args([*base, "--loop-guard", "off"]))
    assert config.loop_guard == "off"
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--loop-guard", "maybe"])
    with pytest.raises(ConfigError, match="--loop-guard: on or off"):
        RunConfig(input="x", out=tmp_path, loop_guard="yes")
