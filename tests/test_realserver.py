"""generate against real llama.cpp `llama-server`s (tiny random Qwen3, real Qwen3 vocabulary and template).

Needs the binary and model that run/llama/build.sh and run/llama/make_tiny_gguf.py put in the cache.
Skipped with the reason when they are absent, unless GEN_PIPELINE_REALSERVER=1 asks for them (as
.ci/run does after building them): then their absence is a failure.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import orjson
import pytest
from conftest import QWEN3
from e2e import check_invariant, prompts, read_jsonl, shape_rows
from procs import wait_for_lines
from provenance_checks import assert_manifest_matches_servers

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.modes import run_async
from gen_pipeline.sim import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run" / "llama"))
import fleet as llama

pytestmark = [pytest.mark.realserver, pytest.mark.slow]

LLAMA = Path(llama.default_server()).parents[1]
MODEL = LLAMA / "models" / "tiny-qwen3.gguf"
REBUILT_TOKENIZER = LLAMA / "qwen3-tokenizer"
CTX = 2048


def _require() -> None:
    missing = [str(p) for p in (Path(llama.default_server()), MODEL) if not p.exists()]
    if not missing:
        return
    reason = f"llama-server or tiny model missing ({', '.join(missing)}); run run/llama/build.sh and make_tiny_gguf.py"
    if os.environ.get("GEN_PIPELINE_REALSERVER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def tokenizer() -> str:
    """The real Qwen3 tokenizer: the shared copy, or the one rebuilt from the llama.cpp vocabulary."""
    for path in (QWEN3, REBUILT_TOKENIZER):
        if (path / "tokenizer.json").exists():
            return str(path)
    pytest.skip("no Qwen3 tokenizer: run run/llama/build_qwen3_tokenizer.py")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two llama-servers (--jinja: the model's own template), 8 slots of 2048 tokens each, stopped after the module."""
    _require()
    run_dir = tmp_path_factory.mktemp("llama")
    started = llama.start_fleet(
        MODEL, free_ports(2), run_dir, parallel=8, ctx_per_slot=CTX, extra_args=["--jinja"], log=lambda _: None
    )
    try:
        yield started
    finally:
        llama.stop_fleet(run_dir, log=lambda _: None)


def _config(inp: Path, out: Path, servers, tokenizer: str, **kw) -> RunConfig:
    settings = {"max_tokens": 16, "min_tokens": 1, "progress": "off", "retry": RetryPolicy.testing(), **kw}
    return RunConfig(input=inp, out=out, servers=tuple(s.url for s in servers), tokenizer=tokenizer, **settings)


def test_generate_counts_exactly_and_skips_what_cannot_fit(servers, tokenizer, write_jsonl, tmp_path):
    """Every row completes with zero token drift; the prompt that cannot fit is skipped unsent."""
    rows = [*prompts(300), {"id": "long", "prompt": "word " * 3000}]
    out = tmp_path / "out"
    outcome = asyncio.run(asyncio.wait_for(run_async(_config(write_jsonl(rows), out, servers, tokenizer)), 300))
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["completed"] == 300 and outcome.summary["failed"] == {"over_length": 1}
    lines = read_jsonl(out / "completions.jsonl")
    assert all(r["prompt_tokens"] == r["input_tokens"] for r in lines)  # the server's count is ours
    assert outcome.summary["token_drift"] == {"compared": 300, "differed": 0, "by_offset": {}}
    [ledger] = read_jsonl(out / "failures.jsonl")
    assert ledger["id"] == "long" and ledger["attempts"] == 0 and ledger["input_tokens"] > CTX
    assert sum(v["requests"] for v in outcome.summary["servers"].values()) == 300


def test_every_request_shape_counts_exactly(servers, tokenizer, write_jsonl, tmp_path):
    """Tools, template kwargs (the run's and a row's own), text parts and tool-call history: every row done
    with zero drift, counted as llama.cpp shapes messages (the server kind is recorded)."""
    out = tmp_path / "out"
    config = _config(write_jsonl([*shape_rows(16), *prompts(4)]), out, servers, tokenizer)
    config = RunConfig(**{**config.__dict__, "chat_template_kwargs": {"enable_thinking": False}})
    outcome = asyncio.run(asyncio.wait_for(run_async(config), 300))
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["completed"] == 20 and outcome.summary["failed"] == {}
    assert outcome.summary["token_drift"] == {"compared": 20, "differed": 0, "by_offset": {}}
    assert outcome.summary["cut_by_server"] == 0
    assert orjson.loads((out / "manifest.json").read_bytes())["server_kind"] == "llamacpp"
    assert_manifest_matches_servers(out, [s.url for s in servers])  # /props model_path, build_info, model_ftype


def test_forced_overflow_gets_the_real_400_and_is_ledgered(servers, tokenizer, write_jsonl, tmp_path):
    """With budgeting defeated (a huge --context-length) the server's own 400 ends in the ledger, once."""
    rows = [*prompts(5), {"id": "long", "prompt": "word " * 3000}]
    out = tmp_path / "out"
    config = _config(write_jsonl(rows), out, servers, tokenizer, context_length=100_000)
    outcome = asyncio.run(asyncio.wait_for(run_async(config), 120))
    assert outcome.summary["failed"] == {"context_overflow": 1}
    [ledger] = read_jsonl(out / "failures.jsonl")
    assert ledger["status"] == 400 and ledger["attempts"] == 1
    m = re.search(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)", ledger["detail"])
    assert m, ledger["detail"]
    assert int(m[1]) == ledger["input_tokens"] and int(m[2]) == CTX  # the server's numbers, equal to ours


def test_check_passes_against_the_real_fleet(servers, tokenizer, write_jsonl, tmp_path):
    """The preflight finds a consistent fleet and exact tokenizer agreement."""
    from gen_pipeline.preflight.check import run_check

    config = _config(write_jsonl(prompts(20)), tmp_path / "out", servers, tokenizer)
    report = asyncio.run(asyncio.wait_for(run_check(config), 120))
    assert report["ok"], report["problems"]
    # each server's 8 slots, from /props total_slots: the capacity is the server's, not a default
    assert all((s["capacity"], s["capacity_source"]) == (8, "reported") for s in report["fleet"]), report["fleet"]


def tokenized_alike(url: str, tokenizer: str, text: str) -> bool:
    """Whether llama-server at `url` splits `text` into the tokens the model's Hugging Face tokenizer does."""
    import urllib.request

    from tokenizers import Tokenizer

    request = urllib.request.Request(f"{url}/tokenize", orjson.dumps({"content": text}), method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        theirs = orjson.loads(answer.read())["tokens"]
    return bool(theirs == Tokenizer.from_file(f"{tokenizer}/tokenizer.json").encode(text, add_special_tokens=False).ids)


def test_whole_conversations_are_regenerated_with_exact_counts(servers, tokenizer, write_jsonl, tmp_path):
    """--turns all on llama.cpp: every turn of every conversation answered once, counted exactly (the
    history holds the server's own earlier answers), each turn asked with the answers written before it."""
    from e2e import conversation_rows

    from gen_pipeline.send.turns import answer_turn, split_turns

    rows = conversation_rows(12)
    out = tmp_path / "out"
    config = _config(write_jsonl(rows), out, servers, tokenizer, turns="all", samples=2)
    outcome = asyncio.run(asyncio.wait_for(run_async(config), 120))
    assert outcome.exit_code == 0, outcome.summary
    lines = {(r["id"], r["sample"], r["turn"]): r for r in read_jsonl(out / "completions.jsonl")}
    turns = sum(len(split_turns(r["messages"])) for r in rows) * 2
    assert len(lines) == turns == outcome.summary["completed"]
    # the server's count is ours wherever it tokenizes the history's answers as the model's tokenizer does:
    # the random model's text (split UTF-8 bytes, rare scripts) is where llama.cpp's own tokenizer differs from
    # the Hugging Face one that SGLang and vLLM use (seen: 1-2 tokens, on 2-3 lines of 84)
    answers = {r["completion"] for r in lines.values()}
    alike = {a: tokenized_alike(servers[0].url, tokenizer, a) for a in answers}
    exact = [r for r in lines.values() if all(alike.get(m["content"], True) for m in r["messages"])]
    assert len(exact) >= len(lines) // 2, f"{len(exact)} of {len(lines)} lines with histories llama.cpp splits alike"
    assert all(r["prompt_tokens"] == r["input_tokens"] for r in exact)
    for (rid, s, t), r in lines.items():
        if t:
            before = lines[(rid, s, t - 1)]
            history = [*before["messages"], answer_turn(before["completion"], before.get("reasoning_content"))]
            assert r["messages"][: len(history)] == history


# Last: it kills one of the module's servers.
def test_killed_server_is_routed_around_and_readmitted(servers, tokenizer, write_jsonl, tmp_path):
    """A server SIGKILLed mid-run and restarted costs no prompt; the run completes exactly once."""
    rows = prompts(600)
    out = tmp_path / "out"
    victim = servers[0]
    restart_dir = tmp_path / "restart"

    async def scenario():
        task = asyncio.create_task(run_async(_config(write_jsonl(rows), out, servers, tokenizer)))
        await asyncio.to_thread(wait_for_lines, out / "completions.jsonl", 60, 120)
        os.kill(victim.pid, signal.SIGKILL)
        await asyncio.sleep(1.5)
        await asyncio.to_thread(
            llama.start_fleet, MODEL, [victim.port], restart_dir, parallel=8, ctx_per_slot=CTX, log=lambda _: None
        )
        return await task

    try:
        outcome = asyncio.run(asyncio.wait_for(scenario(), 300))
    finally:
        llama.stop_fleet(restart_dir, log=lambda _: None)
    assert outcome.exit_code == 0, outcome.summary
    assert check_invariant([r["id"] for r in rows], out) == {"done": 600, "ledger": 0}
    view = outcome.summary["servers"][victim.url]
    assert sum(view["failures"].values()) >= 1 and view["out_of_service_s"] > 0


def test_a_run_streams_through_the_loop_guard_with_exact_usage(servers, tokenizer, write_jsonl, tmp_path):
    """The default run streams (--loop-guard on, stream_options.include_usage): every row done on both servers,
    the usage the stream ends with the same as a whole answer's (prompt tokens as counted, completion max_tokens)."""
    rows = prompts(8)
    out = {guard: tmp_path / guard for guard in ("on", "off")}
    for guard, where in out.items():
        config = _config(write_jsonl(rows, f"{guard}.jsonl"), where, servers, tokenizer, loop_guard=guard, max_tokens=6)
        outcome = asyncio.run(asyncio.wait_for(run_async(config), 300))
        assert outcome.exit_code == 0, outcome.summary
    lines = {guard: {r["id"]: r for r in read_jsonl(where / "completions.jsonl")} for guard, where in out.items()}
    assert set(lines["on"]) == set(lines["off"]) == {r["id"] for r in rows}
    for key, streamed in lines["on"].items():
        whole = lines["off"][key]
        assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (whole["prompt_tokens"], 6)
        assert streamed["prompt_tokens"] == streamed["input_tokens"]
