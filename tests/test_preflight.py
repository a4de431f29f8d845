"""generate refuses at start what `check` calls a PROBLEM: mixed models, mixed context lengths, and rows whose
token counts all drift from the servers' with no offset to learn; --force goes ahead, and says so."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeCounter
from e2e import check_invariant, prompts, read_jsonl

from gen_pipeline.cli import main
from gen_pipeline.config import RetryPolicy, RunConfig, parse_reasons
from gen_pipeline.errors import FleetError
from gen_pipeline.modes import run_async
from gen_pipeline.sim import SimConfig, free_ports, start_fleet


async def _two_fleets(a: dict[str, Any], b: dict[str, Any], run: Any) -> Any:
    first = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, **a)
    async with await start_fleet(first) as one:
        second = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, **b)
        async with await start_fleet(second) as two:
            return await run([*one.urls, *two.urls])


def generate(path: Path, out: Path, a: dict[str, Any], b: dict[str, Any], counter: Any = None, **kw: Any) -> Any:
    """generate against two simulated servers configured `a` and `b`, with a deadline."""

    async def run(urls: list[str]) -> Any:
        settings = {"retry": RetryPolicy.testing(), "progress": "off", "max_tokens": 32, **kw}
        return await run_async(RunConfig(input=path, out=out, servers=tuple(urls), **settings), counter)

    return asyncio.run(asyncio.wait_for(_two_fleets(a, b, run), 60))


@pytest.mark.parametrize(
    ("a", "b", "says"),
    [
        ({"model": "model-a"}, {"model": "model-b"}, "servers report different models"),
        ({"context_length": 4096}, {"context_length": 8192}, "different context lengths"),
    ],
)
def test_a_fleet_check_calls_a_problem_is_refused_at_start(write_jsonl, tmp_path, a, b, says):
    """Nothing is sent or written; the error names the servers and what they report."""
    out = tmp_path / "out"
    with pytest.raises(FleetError, match=says) as info:
        generate(write_jsonl(prompts(10)), out, a, b)
    assert "127.0.0.1" in str(info.value) and "--force" in str(info.value)
    assert read_jsonl(out / "completions.jsonl") == [] and read_jsonl(out / "failures.jsonl") == []


def test_mixed_models_exit_1_with_one_line(write_jsonl, tmp_path, capsys):
    """From the command line: exit 1 and one line naming the models and servers."""
    path, out = write_jsonl(prompts(3)), tmp_path / "out"
    ready: queue.Queue[list[str]] = queue.Queue()
    done = threading.Event()

    async def serve(urls: list[str]) -> None:
        ready.put(urls)
        await asyncio.to_thread(done.wait)

    fleets = threading.Thread(
        target=asyncio.run, args=(_two_fleets({"model": "model-a"}, {"model": "model-b"}, serve),)
    )
    fleets.start()
    try:
        urls = ready.get(timeout=60)
        code = main(["generate", "-i", str(path), "-o", str(out), "-s", ",".join(urls), "--progress", "off"])
    finally:
        done.set()
        fleets.join(30)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(err) == 1 and "model-a" in err[0] and "model-b" in err[0] and urls[1] in err[0]


def test_force_starts_anyway_and_says_so_at_start(write_jsonl, tmp_path, caplog):
    """--force: the run goes ahead on the smallest context, the problem printed as a warning at start."""
    rows = prompts(10)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="gen_pipeline"):
        outcome = generate(write_jsonl(rows), out, {"context_length": 4096}, {"context_length": 8192}, force=True)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 10
    assert any(
        "PROBLEM ignored (--force): servers report different context lengths" in r.message for r in caplog.records
    )
    assert any("different context lengths" in w for w in outcome.summary["warnings"])
    check_invariant([r["id"] for r in rows], out)


def test_every_row_drifting_unlearnably_stops_the_run_early(write_jsonl, tmp_path, capsys):
    """Our counter is not the servers' (a word count): the first rows all drift by varying amounts, so the
    run stops with exit 1 and a PROBLEM line instead of budgeting every row on a wrong count."""
    rows = prompts(400)
    out = tmp_path / "out"
    outcome = generate(write_jsonl(rows), out, {}, {}, counter=FakeCounter(), concurrency=2)
    assert outcome.exit_code == 1 and outcome.summary["stop_reason"].startswith("PROBLEM: token count drift")
    assert "PROBLEM: token count drift" in capsys.readouterr().err
    assert outcome.summary["completed"] < 100
    check_invariant([r["id"] for r in read_jsonl(out / "completions.jsonl")], out)


class Doubling(FakeCounter):
    """Counts two tokens a word: far more than the servers' tokenizer."""

    def count(self, conversations: Any) -> list[int | str]:
        return [2 * int(n) for n in super().count(conversations)]


def test_drift_with_force_goes_on_and_over_length_rows_get_advice(write_jsonl, tmp_path):
    """With --force the run finishes; rows skipped as over_length on the drifting count are not left
    silently: the summary says to rerun with --retry-failed over_length, and that rerun sends them."""
    text = "The quick brown fox jumps over the lazy dog. " * 60  # 673 tokens; 1090 to Doubling
    rows = [*prompts(30), {"id": "long", "prompt": text}]
    path, out = write_jsonl(rows), tmp_path / "out"
    ctx = {"context_length": 1024}
    outcome = generate(path, out, ctx, ctx, counter=Doubling(), force=True, max_tokens=16)
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {"over_length": 1}
    assert any("--retry-failed over_length" in w for w in outcome.summary["warnings"])
    again = generate(path, out, ctx, ctx, retry_failed=parse_reasons("over_length"), max_tokens=16, force=True)
    assert again.summary["completed"] == 1  # the servers' own tokenizer counts it well under 640
