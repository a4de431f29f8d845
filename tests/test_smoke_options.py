"""--limit N (the first N lines) and --system-prompt (a counted system turn recorded in the manifest)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import FakeCounter
from e2e import check_invariant, prompts, read_jsonl, run_sim

from gen_pipeline.cli import build_parser, config_from_args
from gen_pipeline.config import RunConfig
from gen_pipeline.engine.reader import BatchReader
from gen_pipeline.errors import ConfigError, ManifestMismatchError
from gen_pipeline.inputs.rows import BadRow
from gen_pipeline.options import read_system_prompt
from gen_pipeline.preflight.check import run_check
from gen_pipeline.progress.stats import RunStats
from gen_pipeline.records import Prompt
from gen_pipeline.resume.settled import ResumeState
from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.tokens import TINY_TOKENIZER, load_counter

SYSTEM = "You are terse."


def test_limit_reads_exactly_the_first_lines_then_a_rerun_does_the_rest(write_jsonl, tmp_path):
    """--limit 20 settles lines 1-20 (a repeat and a bad row among them) and keeps no input cursor; the
    same command without it does the other rows, each id once."""
    rows: list[Any] = prompts(50)
    rows[5] = rows[4]  # a repeat: one row, processed once
    rows[9] = "{not json"
    path, out = write_jsonl(rows), tmp_path / "out"
    limited, _ = run_sim(path, out, limit=20)
    s = limited.summary
    assert (s["read"], s["completed"], s["failed"], s["repeats_dropped"]) == (19, 18, {"bad_input": 1}, 1)
    done = sorted(r["id"] for r in read_jsonl(out / "completions.jsonl"))
    assert done == [i for i in range(20) if i not in (5, 9)]
    assert not list((out / ".index").glob("*.cursor"))
    rest, _ = run_sim(path, out)
    assert rest.summary["completed"] == 30 and rest.summary["skipped"] == {"done": 18, "bad_input": 1}
    check_invariant([r["id"] for r in prompts(50) if r["id"] not in (5, 9)], out)


@pytest.mark.parametrize("limit", [1, 7, 10, 11])
def test_limit_counts_lines_whoever_reads_them(write_jsonl, tmp_path, limit):
    """Readers of disjoint shards split the first `limit` lines between them: together they read exactly those."""
    path = write_jsonl(prompts(30))
    seen: list[int] = []
    config = RunConfig(input=path, out=tmp_path, limit=limit)
    for shard in range(3):

        def mine(key: int, shard: int = shard) -> bool:
            return key % 3 == shard

        reader = BatchReader(config, FakeCounter(), ResumeState(), stats := RunStats(), mine=mine)
        while batch := reader.next_batch()[0]:
            seen += [p.line for p in batch if isinstance(p, Prompt)]
        assert stats.input_fraction == 1.0
    assert sorted(seen) == list(range(1, limit + 1))


def test_system_prompt_is_added_counted_and_recorded(write_jsonl, tmp_path):
    """Rows without a system turn get it first; the count includes it (the server agrees); the manifest
    records it, and a resume with another one is refused."""
    own = {"id": "own", "messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]}
    path, out = write_jsonl([*prompts(10), own]), tmp_path / "out"
    outcome, _ = run_sim(path, out, system_prompt=SYSTEM)
    assert outcome.exit_code == 0 and outcome.summary["token_drift"]["differed"] == 0
    lines = {r["id"]: r for r in read_jsonl(out / "completions.jsonl")}
    counter = load_counter(str(TINY_TOKENIZER))
    for i in range(10):
        messages = lines[i]["messages"]
        assert messages[0] == {"role": "system", "content": SYSTEM} and messages[1:] == prompts(10)[i]["messages"]
        assert lines[i]["input_tokens"] == counter.count([messages])[0] == lines[i]["prompt_tokens"]
        assert lines[i]["input_tokens"] > counter.count([messages[1:]])[0]
    assert lines["own"]["messages"] == own["messages"]
    assert orjson.loads((out / "manifest.json").read_bytes())["system_prompt"] == SYSTEM
    again, _ = run_sim(path, out, system_prompt=SYSTEM)
    assert again.summary["skipped"] == {"done": 11}
    with pytest.raises(ManifestMismatchError, match="system_prompt"):
        run_sim(path, out, system_prompt="You are verbose.")
    with pytest.raises(ManifestMismatchError, match="system_prompt"):
        run_sim(path, out)


def test_system_prompt_from_a_file(tmp_path):
    """@FILE reads the text (trailing newlines dropped); a missing file or an empty text is an error."""
    (tmp_path / "sys.txt").write_text("Line one.\nLine two.\n\n")
    assert read_system_prompt(f"@{tmp_path / 'sys.txt'}") == "Line one.\nLine two."
    assert read_system_prompt("plain text") == "plain text"
    with pytest.raises(ConfigError, match="cannot read"):
        read_system_prompt(f"@{tmp_path / 'missing.txt'}")
    (tmp_path / "blank.txt").write_text("\n")
    args = ["generate", "-i", "p", "-o", "o", "--system-prompt", f"@{tmp_path / 'blank.txt'}"]
    with pytest.raises(ConfigError, match="--system-prompt is empty"):
        config_from_args(build_parser("generate").parse_args(args))


async def _check(path: Path, tmp_path: Path, **run: Any) -> dict[str, Any]:
    async with await start_fleet(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as fleet:
        config = RunConfig(input=path, out=tmp_path / "none", servers=tuple(fleet.urls), **run)
        return await run_check(config)


def test_check_plans_the_limited_rows_with_the_system_prompt(write_jsonl, tmp_path):
    """check --limit plans exactly the first N lines, counting them with the system prompt."""
    rows = prompts(12)
    path = write_jsonl(rows)
    report = asyncio.run(asyncio.wait_for(_check(path, tmp_path, limit=5, system_prompt=SYSTEM), 30))
    assert report["ok"] and report["plan"]["rows"] == 5 and report["tokenizer"]["agree"]
    counter = load_counter(str(TINY_TOKENIZER))
    with_system = [[{"role": "system", "content": SYSTEM}, *r["messages"]] for r in rows[:5]]
    assert report["plan"]["input_tokens"] == sum(counter.count(with_system))  # type: ignore[arg-type]


def test_check_help_hides_the_flags_that_only_shape_a_run(capsys):
    """check --help leaves out --startup-timeout and the like, but check still accepts them."""
    with pytest.raises(SystemExit):
        build_parser("check").parse_args(["check", "--help"])
    text = capsys.readouterr().out
    for flag in ("--startup-timeout", "--outage-timeout", "--grace-period", "--fsync-interval", "--progress"):
        assert flag not in text
    assert "--max-attempts" not in text and "--limit" in text and "--system-prompt" in text
    args = build_parser("check").parse_args(["check", "-i", "p", "--startup-timeout", "5", "--progress", "off"])
    assert args.startup_timeout == 5 and args.progress == "off"


def test_a_bad_row_within_the_limit_is_still_ledgered(write_jsonl, tmp_path):
    """The reader hands over bad rows within the limit, nothing past it."""
    path = write_jsonl([*prompts(2), "[1]", *prompts(3, start=2)])
    config = RunConfig(input=path, out=tmp_path, limit=3)
    batch, _ = BatchReader(config, FakeCounter(), ResumeState(), RunStats()).next_batch()
    assert [type(x).__name__ for x in batch] == ["Prompt", "Prompt", "BadRow"]
    assert isinstance(batch[2], BadRow) and batch[2].line == 3
