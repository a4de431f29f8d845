"""Samples per prompt: (id, sample) identity, resume of what is missing, dispatch, seeds, n, reasoning."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import FakeCounter
from e2e import prompts, read_jsonl, run_sim

from gen_pipeline.cli import build_parser, config_from_args
from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.errors import ConfigError
from gen_pipeline.inputs.rows import RowError, parse_row
from gen_pipeline.modes import run_async
from gen_pipeline.progress.stats import format_summary
from gen_pipeline.records import id_key
from gen_pipeline.rundir.donekeys import line_key
from gen_pipeline.samples import line_sample, sample_key, sample_seed, truncated_in


def test_sample_zero_keeps_the_id_key_and_other_samples_differ():
    """Sample 0's key is today's id key (old run directories resume); the others are distinct."""
    key = id_key("abc")
    keys = [sample_key(key, s) for s in range(64)]
    assert keys[0] == key and len(set(keys)) == 64
    assert all(0 <= k < 2**64 for k in keys)


@pytest.mark.parametrize(
    ("line", "sample"),
    [
        (b'{"id":"a","sample":3,"messages":[]}', 3),
        (b'{"id":7,"sample":0,"messages":[]}', 0),
        (b'{"id":"a","messages":[],"completion":"x"}', 0),  # written before samples existed
        (b'{"id":"a","messages":[],"meta":{"k":"v"},"sample":2}', 2),  # elsewhere in the line: parsed
        (b'{"id":"a","sample":-1,"messages":[]}', None),
        (b'{"id":"a","sample":"1","messages":[]}', None),
        (b'{"id":"a","completion":"say \\"sample\\" twice"}', 0),  # escaped in a text: not the key
    ],
)
def test_line_sample_table(line, sample):
    """A line's sample is read cheaply where we write it, parsed elsewhere, and refused when invalid."""
    assert line_sample(line) == sample


def test_an_old_line_has_the_key_it_always_had():
    """A completion line without `sample` has id_key(id) as its done key, as before this change."""
    assert line_key(b'{"id":"x1","messages":[],"completion":"c"}\n') == id_key("x1")
    assert line_key(b'{"id":"x1","sample":1,"messages":[]}\n') == sample_key(id_key("x1"), 1)


def test_sample_seeds_derive_from_seed_id_and_sample():
    """The same (seed, id, sample) always gives the same seed; any change gives another."""
    seeds = {sample_seed(5, "a", s) for s in range(8)}
    assert len(seeds) == 8 and sample_seed(5, "a", 3) == sample_seed(5, "a", 3)
    assert sample_seed(5, "a", 0) != sample_seed(6, "a", 0) != sample_seed(6, "b", 0)
    assert all(0 <= s < 2**31 for s in seeds)


@pytest.mark.parametrize(
    ("finish", "content", "reasoning", "expected"),
    [
        ("length", "", "thinking...", "reasoning"),
        ("length", "  ", "thinking...", "reasoning"),
        ("length", "<think>still going", None, "reasoning"),
        ("length", "partial answer", "done thinking", "answer"),
        ("stop", "", "thinking", None),
        ("stop", "answer", None, None),
    ],
)
def test_truncated_in_table(finish, content, reasoning, expected):
    """A cut while thinking (no answer yet) is told from a cut answer."""
    assert truncated_in(finish, content, reasoning) == expected


def _args(*argv: str) -> Any:
    return build_parser("generate").parse_args(["generate", "-i", "x.jsonl", "-o", "o", *argv])


def test_n_in_sampling_becomes_samples_or_is_refused():
    """`n` in --sampling is the samples count; contradicting --samples is refused with a clear message."""
    config = config_from_args(_args("--sampling", '{"n": 3, "top_k": 5}'))
    assert (config.samples, config.sampling) == (3, {"top_k": 5})
    with pytest.raises(ConfigError, match='"n": 3 in --sampling contradicts samples 2'):
        config_from_args(_args("--sampling", '{"n": 3}', "--samples", "2"))
    with pytest.raises(ConfigError, match='"n" in --sampling'):
        RunConfig(input=Path("x"), out=Path("o"), sampling={"n": 2})


def test_an_n_beyond_64_bits_in_the_flag_is_quoted_as_written():
    """`--sampling '{"n": 1000...0}'` is refused naming the number the flag wrote, not "1e+30"."""
    big = "1" + "0" * 30
    with pytest.raises(ConfigError, match=f"4096, not {big}$"):
        config_from_args(_args("--sampling", f'{{"n": {big}}}'))


def test_a_rows_n_becomes_its_samples_or_is_a_bad_row():
    """A row's sampling `n` becomes its samples; `n` against the row's own samples is bad input."""
    p = parse_row(b'{"id": 1, "prompt": "hi", "sampling": {"n": 4, "top_p": 0.9}}', 1)
    assert (p.samples, p.sampling) == (4, {"top_p": 0.9})
    assert parse_row(b'{"id": 1, "prompt": "hi", "samples": 2}', 1).samples == 2
    with pytest.raises(RowError, match="contradicts samples 2"):
        parse_row(b'{"id": 1, "prompt": "hi", "samples": 2, "sampling": {"n": 3}}', 1)
    with pytest.raises(RowError, match="samples must be an integer"):
        parse_row(b'{"id": 1, "prompt": "hi", "samples": 0}', 1)


def _by_id(out: Path) -> dict[Any, list[dict[str, Any]]]:
    lines: dict[Any, list[dict[str, Any]]] = {}
    for r in read_jsonl(out / "completions.jsonl"):
        lines.setdefault(r["id"], []).append(r)
    return lines


def _log(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


def test_samples_with_n_cost_one_request_per_prompt(write_jsonl, tmp_path):
    """--samples 4: 4 lines per prompt with samples 0-3, the server's own answers, one request each."""
    rows = prompts(30)
    path, log = write_jsonl(rows), tmp_path / "requests.jsonl"
    outcome, fleet = run_sim(path, tmp_path / "out", sim={"request_log": str(log), "n_ports": 2}, samples=4)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 120
    by_id = _by_id(tmp_path / "out")
    assert sorted(by_id) == list(range(30))
    assert all(sorted(r["sample"] for r in lines) == [0, 1, 2, 3] for lines in by_id.values())
    requests = _log(log)
    assert len(requests) == 30 and all(r["n"] == 4 for r in requests)
    given = {(r["prompt"]): r["texts"] for r in requests}
    for row in rows:
        digest = _digest(row["messages"])
        assert [r["completion"] for r in sorted(by_id[row["id"]], key=lambda r: r["sample"])] == given[digest]
    assert sum(s.requests for s in fleet.stats.values()) == 30


def _digest(messages: list[dict[str, Any]]) -> str:
    import hashlib

    return hashlib.blake2b(orjson.dumps(messages), digest_size=8).hexdigest()


def test_samples_via_requests_stay_on_one_server(write_jsonl, tmp_path):
    """--samples-via requests: one request per sample, all of a prompt's on one server (one prefill)."""
    rows = prompts(20)
    path, log = write_jsonl(rows), tmp_path / "requests.jsonl"
    sim = {"request_log": str(log), "n_ports": 4, "prefix_cache": 1000}
    outcome, fleet = run_sim(path, tmp_path / "out", sim=sim, samples=3, samples_via="requests", concurrency=2)
    assert outcome.summary["completed"] == 60
    ports: dict[str, set[int]] = {}
    for r in _log(log):
        ports.setdefault(r["prompt"], set()).add(r["port"])
    assert len(ports) == 20 and all(len(p) == 1 for p in ports.values())
    assert sum(s.prefills for s in fleet.stats.values()) == 20


def test_prefix_cache_hits_are_read_and_shown_per_server(write_jsonl, tmp_path):
    """usage.prompt_tokens_details.cached_tokens (SGLang --enable-cache-report) adds up per server in the summary:
    the second and third sample of each prompt come from the cache, all but their last token."""
    sim = {"n_ports": 2, "prefix_cache": 1000, "cache_report": True}
    outcome, _ = run_sim(write_jsonl(prompts(10)), tmp_path / "out", sim=sim, samples=3, samples_via="requests")
    servers = outcome.summary["servers"].values()
    prompt_tokens, cached = sum(s["prompt_tokens"] for s in servers), sum(s["cached_tokens"] for s in servers)
    assert prompt_tokens % 3 == 0 and cached == 2 * (prompt_tokens // 3) - 2 * 10
    assert all(s["capacity_source"] == "loads endpoint" for s in servers)
    assert "prefix cache" in format_summary(outcome.summary)


def test_seeded_samples_are_reproducible_and_resent_alike(write_jsonl, tmp_path):
    """With a seed, each sample has its own derived seed: a second run gets the very same answers."""
    path = write_jsonl(prompts(8))
    run_sim(path, tmp_path / "a", samples=3, sampling={"seed": 11})
    run_sim(path, tmp_path / "b", samples=3, sampling={"seed": 11})
    a, b = (sorted((r["id"], r["sample"], r["completion"]) for r in read_jsonl(d / "completions.jsonl")) for d in
            (tmp_path / "a", tmp_path / "b"))  # fmt: skip
    assert a == b and len(a) == 24
    assert len({c for _, _, c in a}) > 8  # the samples of a prompt differ


def test_a_resume_sends_only_the_missing_samples(write_jsonl, tmp_path):
    """Two samples done, the run asks for four: one request with n=2 per prompt, samples 2 and 3."""
    path, log, out = write_jsonl(prompts(12)), tmp_path / "requests.jsonl", tmp_path / "out"
    run_sim(path, out, samples=2)
    outcome, _ = run_sim(path, out, sim={"request_log": str(log)}, samples=4)
    assert outcome.summary["completed"] == 24
    assert [r["n"] for r in _log(log)] == [2] * 12
    by_id = _by_id(out)
    assert all(sorted(r["sample"] for r in lines) == [0, 1, 2, 3] for lines in by_id.values())
    again, fleet = run_sim(path, out, samples=4)
    assert again.summary["skipped"] == {"done": 12} and sum(s.requests for s in fleet.stats.values()) == 0


def test_a_directory_written_before_samples_resumes(write_jsonl, tmp_path):
    """Lines without `sample` (the old format) count as sample 0: nothing is sent again."""
    path, out = write_jsonl(prompts(10)), tmp_path / "out"
    run_sim(path, out)
    old = [orjson.loads(line) for line in (out / "completions.jsonl").read_bytes().splitlines()]
    (out / "completions.jsonl").write_bytes(b"".join(orjson.dumps({k: v for k, v in r.items() if k != "sample"}) + b"\n"
                                                     for r in old))  # fmt: skip
    for p in (out / ".index").iterdir():
        p.unlink()
    outcome, fleet = run_sim(path, out)
    assert outcome.summary["skipped"] == {"done": 10} and sum(s.requests for s in fleet.stats.values()) == 0
    outcome, fleet = run_sim(path, out, samples=2)
    assert outcome.summary["completed"] == 10 and Counter(
        r.get("sample", 0) for r in read_jsonl(out / "completions.jsonl")
    ) == {0: 10, 1: 10}


def test_rows_own_samples_and_own_short_max_tokens(write_jsonl, tmp_path):
    """A row's `samples` overrides --samples; rows asking for 1-15 tokens are sent, never over_length."""
    rows: list[dict[str, Any]] = [{"id": i, "prompt": f"label this {i}", "max_tokens": i} for i in range(1, 16)]
    rows.append({"id": "many", "prompt": "five of these", "samples": 5})
    outcome, _ = run_sim(write_jsonl(rows), tmp_path / "out", samples=2)
    counts = Counter(r["id"] for r in read_jsonl(tmp_path / "out" / "completions.jsonl"))
    assert counts == {**{i: 2 for i in range(1, 16)}, "many": 5}
    assert outcome.summary["failed"] == {}
    assert all(r["max_tokens"] == r["id"] for r in read_jsonl(tmp_path / "out" / "completions.jsonl")
               if r["id"] != "many")  # fmt: skip


def test_reasoning_truncations_are_rejected_and_kept(write_jsonl, tmp_path):
    """A budget the thinking uses up ends "length" with no answer: never written (its thinking is no answer to
    train on), kept in rejected.jsonl (unfinished_reasoning, its thinking with it) and, resampled in vain,
    ledgered invalid; the written answers' tokens are split into reasoning and answer."""
    path, out = write_jsonl(prompts(10)), tmp_path / "out"
    sim = {"reasoning_words": 40, "completion_words": 10}
    outcome, _ = run_sim(path, out, sim=sim, max_tokens=8, min_tokens=4, samples_via="requests")
    lines, failed = read_jsonl(out / "completions.jsonl"), read_jsonl(out / "failures.jsonl")
    kept = read_jsonl(out / "rejected.jsonl")
    assert kept and all(r["check"] == "unfinished_reasoning" and r["reasoning_content"] for r in kept)
    assert all(r["completion"] == "" and r["finish_reason"] == "length" for r in kept)
    assert lines and all(r.get("truncated_in") != "reasoning" for r in lines)
    assert outcome.summary["truncated_in_reasoning"] == 0 and len(lines) + len(failed) == 10
    assert {f["id"] for f in failed} == {r["id"] for r in kept} and {f["reason"] for f in failed} == {"invalid"}
    split = outcome.summary["reasoning_tokens"]
    assert split["reasoning"] + split["answer"] == sum(r["completion_tokens"] for r in lines) and split["reasoning"]
    assert all(r["reasoning_tokens"] <= r["completion_tokens"] for r in lines)
    from gen_pipeline.views.report import render_table
    from gen_pipeline.views.rundata import read_completions, read_json

    table = render_table(out, read_completions(out), read_json(out / "summary.json"), None)
    assert f"reasoning   {split['reasoning']:,} tokens" in table


def test_thinking_budget_is_sent_by_server_kind(write_jsonl, tmp_path):
    """--thinking-budget sends SGLang's thinking_budget: a server enforcing it caps the thinking, no warning;
    one that ignores it (SGLang 0.5.23's chat API: the field is accepted and does nothing) thinks on, and the
    summary says the budget was not enforced (it said nothing: seen against a real SGLang)."""
    path = write_jsonl(prompts(6))
    sim = {"reasoning_words": 300, "completion_words": 100, "thinking_budget_enforced": True}
    outcome, _ = run_sim(path, tmp_path / "out", sim=sim, thinking_budget=2, max_tokens=400)
    assert outcome.summary["completed"] == 6
    assert all(len(r["reasoning_content"].split()) <= 2 for r in read_jsonl(tmp_path / "out" / "completions.jsonl"))
    assert not [w for w in outcome.summary["warnings"] if "thinking-budget" in w]
    sim["thinking_budget_enforced"] = False
    ignored, _ = run_sim(path, tmp_path / "ignored", sim=sim, thinking_budget=2, max_tokens=400)
    thought = [r["reasoning_tokens"] for r in read_jsonl(tmp_path / "ignored" / "completions.jsonl")]
    over = [t for t in thought if t > 2 + 2]
    assert over, thought
    [said] = [w for w in ignored.summary["warnings"] if "thought past --thinking-budget 2" in w]
    assert said.startswith(f"{len(over)} answer(s)") and f"up to {max(over)} reasoning" in said
    assert "the servers do not enforce it" in said


def test_thinking_budget_is_refused_where_the_server_has_none(write_jsonl, tmp_path):
    """A server kind with no known thinking-budget parameter refuses the flag before anything is sent."""

    async def scenario() -> Any:
        async with FakeServer(choices=1, kind="llama.cpp") as url:
            return await run_async(_fake_config(write_jsonl, tmp_path, url, thinking_budget=100), FakeCounter())

    with pytest.raises(ConfigError, match="--thinking-budget: no thinking-budget parameter known for"):
        asyncio.run(asyncio.wait_for(scenario(), 30))


class _Fake:
    """A server that answers every chat request with `choices` choices, whatever n asks."""

    def __init__(self, choices: int, kind: str) -> None:
        self.choices, self.kind, self.bodies = choices, kind, list[dict[str, Any]]()

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": "fake", "max_model_len": 4096, "owned_by": self.kind}
        return web.json_response({"object": "list", "data": [card]})

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": f"c{len(self.bodies)}.{i}"},
             "finish_reason": "stop", "logprobs": {"content": [{"token": "c", "logprob": -0.5}]}}
            for i in range(self.choices)
        ]  # fmt: skip
        usage = {"prompt_tokens": 10, "completion_tokens": 2 * self.choices}
        return web.json_response({"choices": choices, "usage": usage})


class FakeServer:
    """A _Fake served on a free port, as `async with FakeServer(...) as url`."""

    def __init__(self, choices: int, kind: str = "vllm") -> None:
        self.fake = _Fake(choices, kind)

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self.fake.models)
        app.router.add_post("/v1/chat/completions", self.fake.chat)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()


def _fake_config(write_jsonl, tmp_path: Path, url: str, **kw: Any) -> RunConfig:
    rows = [{"id": i, "prompt": f"question {i}"} for i in range(3)]
    settings = {"retry": RetryPolicy.testing(), "progress": "off", "max_tokens": 32, "tokenizer": "fake", **kw}
    return RunConfig(input=write_jsonl(rows), out=tmp_path / "out", servers=(url,), **settings)


def test_a_short_answer_to_n_is_topped_up_one_request_a_sample(write_jsonl, tmp_path):
    """A server that answers n=4 with one choice: the other three are single requests, one warning."""
    server = FakeServer(choices=1)

    async def scenario() -> Any:
        async with server as url:
            cfg = _fake_config(write_jsonl, tmp_path, url, samples=4, sampling={"logprobs": True})
            return await run_async(cfg, FakeCounter())

    outcome = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert outcome.summary["completed"] == 12
    assert [b.get("n") for b in server.fake.bodies].count(4) == 3 and len(server.fake.bodies) == 12
    assert sum("answered n=4 with 1 choice" in w for w in outcome.summary["warnings"]) == 1
    lines = read_jsonl(tmp_path / "out" / "completions.jsonl")
    assert Counter((r["id"], r["sample"]) for r in lines) == {(i, s): 1 for i in range(3) for s in range(4)}
    assert all(r["logprobs"] == {"content": [{"token": "c", "logprob": -0.5}]} for r in lines)


def _export(runs: list[Path], out: Path, **kw: Any) -> Any:
    import datasets

    from gen_pipeline.export.export import ExportConfig, export

    stats = export(ExportConfig(runs=tuple(runs), out=out, **kw))
    files = sorted(str(p) for p in (out / "data").glob("*.parquet"))
    return stats, datasets.load_dataset("parquet", data_files=files, split="train")


def test_export_one_row_per_sample_or_grouped(write_jsonl, tmp_path):
    """export: a row per (id, sample) with its sample column; --group-samples: a row per prompt."""
    run_sim(write_jsonl(prompts(5)), tmp_path / "run", samples=3)
    _, flat = _export([tmp_path / "run"], tmp_path / "flat")
    assert len(flat) == 15 and sorted(Counter(flat["sample"]).items()) == [(0, 5), (1, 5), (2, 5)]
    stats, grouped = _export([tmp_path / "run"], tmp_path / "grouped", group_samples=True)
    assert len(grouped) == stats.written == 5 and stats.lines == 15  # what export says it wrote (it said 15)
    by_id = _by_id(tmp_path / "run")
    for row in grouped:
        lines = sorted(by_id[int(row["id"])], key=lambda r: r["sample"])
        assert row["completions"] == [r["completion"] for r in lines] and row["sample"] == [0, 1, 2]
        assert row["messages"][-1]["role"] == "user"  # the prompt turns; the answers are the list


def test_export_counts_and_drops_reasoning_truncations(write_jsonl, tmp_path):
    """Cuts while reasoning (as versions before the answer checks wrote them) are exported with truncated_in
    (counted in the card) or dropped on request."""
    sim = {"reasoning_words": 40, "completion_words": 10}
    run_sim(write_jsonl(prompts(10)), tmp_path / "run", sim=sim, max_tokens=200)
    output = tmp_path / "run" / "completions.jsonl"
    lines, cut = read_jsonl(output), 3
    for r in lines[:cut]:
        r.update(completion="", finish_reason="length", truncated_in="reasoning")
    output.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    columns = ("id", "sample", "truncated_in")
    stats, kept = _export([tmp_path / "run"], tmp_path / "all", columns=columns)
    assert len(kept) == 10 and kept["truncated_in"].count("reasoning") == cut and stats.truncated_in_reasoning == cut
    assert (
        "| of them cut while reasoning (truncated_in reasoning) | " + str(cut)
        in (tmp_path / "all" / "README.md").read_text()
    )
    stats, dropped = _export([tmp_path / "run"], tmp_path / "drop", columns=columns, drop_truncated_reasoning=True)
    assert len(dropped) == 10 - cut and stats.truncated == cut and "reasoning" not in dropped["truncated_in"]
    _, none_cut = _export([tmp_path / "run"], tmp_path / "drop-all", columns=columns, drop_truncated=True)
    assert "reasoning" not in none_cut["truncated_in"]


def test_logprobs_asked_for_are_an_export_column(write_jsonl, tmp_path):
    """The logprobs a server returned stay in each output line and export as a JSON column."""
    server = FakeServer(choices=2)

    async def scenario() -> Any:
        async with server as url:
            cfg = _fake_config(write_jsonl, tmp_path, url, samples=2, sampling={"logprobs": True, "top_logprobs": 1})
            return await run_async(cfg, FakeCounter())

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert all(b["n"] == 2 and b["top_logprobs"] == 1 for b in server.fake.bodies) and len(server.fake.bodies) == 3
    _, ds = _export([tmp_path / "out"], tmp_path / "ds", columns=("id", "sample", "logprobs"))
    assert len(ds) == 6 and all(orjson.loads(v)["content"][0]["logprob"] == -0.5 for v in ds["logprobs"])


def test_check_plans_every_sample(write_jsonl, tmp_path):
    """check's plan counts the samples to make and budgets output for each; a resume's are left out."""
    from gen_pipeline.preflight.check import run_check
    from gen_pipeline.sim import SimConfig, free_ports, start_fleet

    rows = [*prompts(6), {"id": "own", "prompt": "just two", "samples": 2}]
    path, out = write_jsonl(rows), tmp_path / "out"

    async def plan(samples: int) -> dict[str, Any]:
        async with await start_fleet(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as fleet:
            cfg = RunConfig(input=path, out=out, servers=tuple(fleet.urls), samples=samples, max_tokens=64,
                            retry=RetryPolicy.testing(), progress="off")  # fmt: skip
            return (await run_check(cfg, resume=True))["plan"]

    first = asyncio.run(asyncio.wait_for(plan(3), 30))
    assert first["samples"] == 6 * 3 + 2 and first["output_budget"] == 64 * first["samples"]
    run_sim(path, out, samples=1)
    again = asyncio.run(asyncio.wait_for(plan(3), 30))
    assert again["samples"] == 6 * 2 and again["output_budget"] == 64 * again["samples"]


def test_the_ledger_and_retry_failed_work_per_sample(write_jsonl, tmp_path):
    """A permanent ledger entry for one sample settles only that sample; --retry-failed resends it."""
    path, out = write_jsonl(prompts(3)), tmp_path / "out"
    run_sim(write_jsonl([], "empty.jsonl"), out, samples=2)  # the manifest of this fleet
    with (out / "failures.jsonl").open("ab") as f:
        f.write(orjson.dumps({"id": 1, "sample": 1, "line": 2, "reason": "bad_request", "time": 1.0}) + b"\n")
    outcome, _ = run_sim(path, out, samples=2)
    done = Counter((r["id"], r["sample"]) for r in read_jsonl(out / "completions.jsonl"))
    assert set(done) == {(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)} and outcome.summary["completed"] == 5
    again, _ = run_sim(path, out, samples=2, retry_failed=frozenset({"bad_request"}))
    assert again.summary["completed"] == 1 and (1, 1) in {
        (r["id"], r["sample"]) for r in read_jsonl(out / "completions.jsonl")
    }


@pytest.mark.slow  # an end-to-end run of several seconds; make test-fast leaves it out
def test_workers_split_samples_and_resume(write_jsonl, tmp_path):
    """--workers 2 --samples 3, then a resume with --samples 4 and one worker: each (id, sample) once."""
    from procs import run_generate, sim_fleet

    path, out = write_jsonl(prompts(40)), tmp_path / "out"
    with sim_fleet(2) as servers:
        first = run_generate(path, out, servers, "--workers", "2", "--samples", "3")
        second = run_generate(path, out, servers, "--samples", "4")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    from gen_pipeline.rundir.layout import RunDir

    keys = [(r["id"], r["sample"]) for p in RunDir(out).completion_files() for r in read_jsonl(p)]
    assert len(keys) == len(set(keys)) == 160
