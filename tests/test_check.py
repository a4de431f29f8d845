"""`gen-pipeline check` against the simulated fleet: fleet, tokenizer agreement, and a plan that equals the run."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson
import pytest
from e2e import fleet_in_thread, prompts, read_jsonl, run_sim

from gen_pipeline.cli import main
from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.modes import run_async
from gen_pipeline.preflight.check import render_check, run_check
from gen_pipeline.sim import SimConfig, free_ports, start_fleet

CTX = 1024
MAX_TOKENS = 600


def sim(n: int = 2, **kw: Any) -> SimConfig:
    return SimConfig(ports=tuple(free_ports(n)), health_delay=0.0, **kw)


async def _check_against(sims: list[SimConfig], input_path, tmp_path, **run: Any) -> dict[str, Any]:
    fleets = [await start_fleet(s) for s in sims]
    try:
        urls = tuple(u for f in fleets for u in f.urls)
        settings = {"max_tokens": MAX_TOKENS, **run}
        return await run_check(RunConfig(input=input_path, out=tmp_path / "out", servers=urls, **settings))
    finally:
        for f in fleets:
            await f.aclose()


def check(sims: list[SimConfig], input_path, tmp_path, **run: Any) -> dict[str, Any]:
    """run_check against simulated fleets, with a deadline."""
    return asyncio.run(asyncio.wait_for(_check_against(sims, input_path, tmp_path, **run), 30))


def test_healthy_fleet_passes(write_jsonl, tmp_path):
    """Every server up and alike, the tokenizer agrees exactly, the plan sends everything in full."""
    report = check([sim(2, context_length=CTX)], write_jsonl(prompts(8)), tmp_path)
    assert report["ok"], report["problems"]
    assert all(s["up"] and s["healthy"] and s["max_running_requests"] == 64 for s in report["fleet"])
    assert report["tokenizer"]["agree"] and report["tokenizer"]["compared"] == 6  # 3 rows x 2 servers
    assert report["plan"]["full"] == 8 and report["plan"]["clamped"] == report["plan"]["over_length"] == 0


def _two_contexts() -> list[SimConfig]:
    return [sim(1, context_length=CTX), sim(1, context_length=2 * CTX)]


def _one_down() -> list[SimConfig]:
    ports = tuple(free_ports(3))
    return [SimConfig(ports=ports, dead=(ports[1],), context_length=CTX, health_delay=0.0)]


@pytest.mark.parametrize(
    ("sims", "reason"),
    [
        (_one_down, "1 of 3 servers down"),
        (_two_contexts, "different context lengths"),
        (lambda: [sim(2, context_length=CTX, template_extra_tokens=5)], "token count drift"),
    ],
    ids=["one-port-down", "context-differs", "tokenizer-mismatch"],
)
def test_fleet_faults_fail_with_their_reason(sims, reason, write_jsonl, tmp_path):
    """A dead port, a different max_model_len and a tokenizer that miscounts each fail the check."""
    report = check(sims(), write_jsonl(prompts(6)), tmp_path)
    assert not report["ok"]
    assert len(report["problems"]) == 1 and reason in report["problems"][0], report["problems"]


def test_no_server_up_is_the_problem_and_no_flag_is_blamed(write_jsonl, tmp_path):
    """Nothing listening: the problem says no server is up, and the missing plan says why (it said "the
    servers report no model id; pass --model", as if a flag were the fix)."""
    ports = tuple(free_ports(2))
    report = check([SimConfig(ports=ports, dead=ports, health_delay=0.0)], write_jsonl(prompts(2)), tmp_path)
    assert not report["ok"]
    assert report["problems"][0].startswith("no server is up: ")
    assert report["problems"][1].startswith("no budget plan: no server is up to report the model"), report
    assert "pass --model" not in " ".join(report["problems"])


def test_tokenizer_drift_suggests_a_margin(write_jsonl, tmp_path):
    """Five uncounted template tokens: drift +5 on every probe, and a margin of at least 5 + 16."""
    report = check([sim(1, template_extra_tokens=5)], write_jsonl(prompts(4)), tmp_path)
    assert report["tokenizer"]["drift"] == {"5": 3}
    assert report["tokenizer"]["suggested_safety_margin"] == 21
    assert "--safety-margin 21" in report["problems"][0]


def mixed_rows() -> list[Any]:
    """Short, long and too-long prompts, a row budget, bad rows and a repeat."""
    rows: list[Any] = [{"id": i, "prompt": "tell me more " * (1 + (i * 37) % 120)} for i in range(40)]
    rows += [{"id": "own", "prompt": "short one", "max_tokens": 10}, {"id": "own-long", "prompt": "x " * 700}]
    rows += [b"{not json", {"id": "empty", "prompt": "  "}, rows[3], {"id": 3, "prompt": "other content"}]
    return rows


async def _plan_then_generate(input_path, tmp_path) -> tuple[dict[str, Any], Any]:
    async with await start_fleet(sim(2, context_length=CTX)) as fleet:
        cfg = RunConfig(
            input=input_path,
            out=tmp_path / "run",
            servers=tuple(fleet.urls),
            max_tokens=MAX_TOKENS,
            retry=RetryPolicy.testing(),
            progress="off",
        )
        report = await run_check(cfg)
        return report, await run_async(cfg)


def test_plan_counts_equal_what_generate_does(write_jsonl, tmp_path):
    """full / clamped / over_length / bad and the clamped budgets equal generate's ledger and output."""
    path = write_jsonl(mixed_rows())
    report, outcome = asyncio.run(asyncio.wait_for(_plan_then_generate(path, tmp_path), 30))
    plan = report["plan"]
    done = read_jsonl(tmp_path / "run" / "completions.jsonl")
    ledger = Counter(r["reason"] for r in read_jsonl(tmp_path / "run" / "failures.jsonl"))
    requested = {"own": 10}
    full = [r for r in done if r["max_tokens"] == requested.get(r["id"], MAX_TOKENS)]
    clamped = sorted(r["max_tokens"] for r in done if r["max_tokens"] < requested.get(r["id"], MAX_TOKENS))
    assert plan["full"] > 0 and plan["clamped"] > 0 and plan["over_length"] > 0  # the input exercises all three
    assert (plan["full"], plan["clamped"]) == (len(full), len(clamped))
    # "own" asks for 10 tokens, below --min-tokens: it is sent (with 10), not over_length
    assert (plan["over_length"], plan["bad_input"]) == (ledger["over_length"], ledger["bad_input"]) == (4, 3)
    assert [r["max_tokens"] for r in done if r["id"] == "own"] == [10]
    assert (plan["clamped_to"]["min"], plan["clamped_to"]["max"]) == (clamped[0], clamped[-1])
    assert plan["input_tokens"] == outcome.summary["input_tokens"]
    assert plan["output_budget"] == sum(r["max_tokens"] for r in done)
    assert plan["repeats_dropped"] == outcome.summary["repeats_dropped"] == 1


def test_mostly_clamped_input_fails_as_waste(write_jsonl, tmp_path):
    """Prompts that leave under a quarter of --max-tokens for most rows are a problem."""
    rows = [{"id": i, "prompt": "tell me more " * 95} for i in range(6)] + prompts(2)
    report = check([sim(1, context_length=CTX)], write_jsonl(rows), tmp_path)
    assert report["plan"]["starved"] == 6
    assert any("clamped below a quarter" in p for p in report["problems"]), report["problems"]


def test_everything_over_length_fails(write_jsonl, tmp_path):
    """No prompt fits: the check fails and says nothing would be sent."""
    rows = [{"id": i, "prompt": "word " * 1500} for i in range(3)]
    report = check([sim(1, context_length=CTX)], write_jsonl(rows), tmp_path)
    assert report["plan"]["over_length"] == 3 and "tokenizer" not in report
    assert any("every prompt (3) is over_length" in p for p in report["problems"])


def test_command_line_exit_codes_and_json(write_jsonl, tmp_path, capsys):
    """check exits 0 on a good fleet and 1 with one PROBLEM line per problem; --json writes the report."""
    path = write_jsonl(prompts(5))
    with fleet_in_thread(sim(2, context_length=CTX)) as servers:
        args = ["check", "-i", str(path), "-s", servers, "--max-tokens", str(MAX_TOKENS), "--json"]
        assert main([*args, str(tmp_path / "ok.json")]) == 0
        assert "check: OK" in capsys.readouterr().out
        assert main([*args, str(tmp_path / "bad.json"), "--context-length", "20"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: every prompt (5) is over_length" in out and "check: FAILED (1 problem(s))" in out
    assert orjson.loads((tmp_path / "ok.json").read_bytes())["ok"] is True
    assert orjson.loads((tmp_path / "bad.json").read_bytes())["ok"] is False


def test_a_fleet_larger_than_the_open_file_limit_is_a_warning(write_jsonl, tmp_path, monkeypatch):
    """check says what generate will do when the servers take more requests than the open-file limit allows."""
    import gen_pipeline.preflight.checkfleet as check_module

    monkeypatch.setattr(check_module, "open_file_limit", lambda: 100)  # 2 servers x 64 slots need 128
    roomy = sim(2, context_length=CTX, max_total_tokens=64 * MAX_TOKENS)  # the KV pool admits all 64
    report = check([roomy], write_jsonl(prompts(4)), tmp_path)
    assert report["ok"], report["problems"]
    assert any("open-file limit (ulimit -n) is 100: keeping 36 in flight" in w for w in report["warnings"])


@pytest.mark.parametrize(
    ("settings", "run", "capacity", "source"),
    [
        ({"report_max_running": True, "max_total_tokens": 10**6}, {}, 64, "reported"),
        ({"max_total_tokens": 10**6}, {}, 64, "loads endpoint"),  # /server_info says null (SGLang 0.5.23)
        ({}, {}, 13, "token pool"),  # 8 contexts of 1024 hold 13 requests of max_tokens 600
        ({}, {"concurrency": 5}, 5, "--concurrency"),
    ],
)
def test_capacity_comes_from_the_servers_and_says_where(write_jsonl, tmp_path, settings, run, capacity, source):
    """Each server's capacity is what it reports, its /v1/loads figure where /server_info says null, or what its
    KV token pool admits when that is less; check shows the source and the server's limits."""
    report = check([sim(1, context_length=CTX, **settings)], write_jsonl(prompts(4)), tmp_path, **run)
    [server] = report["fleet"]
    assert (server["capacity"], server["capacity_source"]) == (capacity, source)
    assert server["max_req_input_len"] == CTX - 6 and server["version"] == "0.5.23"
    assert f"capacity {capacity} ({source})" in render_check(report)
    assert not any("is a guess" in w for w in report["warnings"])


def test_a_prompt_over_the_servers_input_cap_is_over_length_unsent(write_jsonl, tmp_path):
    """SGLang refuses a prompt of max_req_input_len tokens or more (context - 6, or less with a small KV pool)
    even when the context has room: check plans it over_length and generate skips it unsent (no 400)."""
    small_pool = {"context_length": CTX, "max_total_tokens": 600}  # max_req_input_len 594 on a 1024 context
    rows = [*prompts(3), {"id": "long", "prompt": "word " * 137}]  # ~700 tokens: room in the context, over the cap
    path = write_jsonl(rows)
    report = check([sim(1, **small_pool)], path, tmp_path)
    assert report["settings"]["max_input_tokens"] == 594 and report["plan"]["over_length"] == 1
    outcome, fleet = run_sim(path, tmp_path / "out", sim={"n_ports": 1, **small_pool}, max_tokens=MAX_TOKENS)
    assert outcome.summary["failed"] == {"over_length": 1}
    assert outcome.summary["completed"] == 3
    assert sum(s.length_errors for s in fleet.stats.values()) == 0
    [skipped] = read_jsonl(tmp_path / "out" / "failures.jsonl")
    assert "the servers refuse inputs of 594 tokens or more" in skipped["detail"]


CAPACITY_TABLE = [
    ({"max_running_requests": 48}, {}, (48, "reported")),
    ({"max_running_requests": 2048, "max_total_num_tokens": 8192}, {}, (8192 // 64, "token pool")),
    ({"max_running_requests": 8, "max_total_num_tokens": 10**6}, {}, (8, "reported")),
    ({"max_total_num_tokens": 100_000}, {"max_tokens": 10_000}, (100_000 // 4096, "token pool")),
    # a request holds at most the context (its max_tokens is clamped to what is left): 8192 // 512, not // 2048
    ({"max_total_num_tokens": 8192, "context_length": 512}, {"max_tokens": 2048}, (16, "token pool")),
    ({}, {}, (64, "default")),
    ({"max_running_requests": 48}, {"concurrency": 5}, (5, "--concurrency")),
]


@pytest.mark.parametrize(("reports", "settings", "want"), CAPACITY_TABLE)
def test_capacity_table(tmp_path, reports, settings, want):
    """Where each server's capacity comes from: --concurrency, what it reports (capped by its KV pool, whose
    admitted requests each reserve max_tokens clipped at 4096), and the default only when it says nothing."""
    from gen_pipeline.fleet.capacity import guess_warning, server_capacity
    from gen_pipeline.fleet.discovery import ServerInfo

    settings = {"max_tokens": 64, **settings}
    config = RunConfig(input=tmp_path / "in.jsonl", out=tmp_path / "out", servers=("127.0.0.1:1",), **settings)
    reports = {"context_length": 8192, **reports}
    found = server_capacity(config, ServerInfo("s", "m", **reports))
    assert (found.requests, found.source) == want
    warning = guess_warning(["s"] if found.source == "default" else [])
    assert (warning is not None) == (want[1] == "default") and (warning is None or "is a guess" in warning)


def test_check_says_what_generate_does_with_an_unfinished_last_line_and_a_cut_stream(tmp_path):
    """A last line with no newline that is not whole JSON: check warns as generate's summary does (it passed
    saying nothing, and generate then exited 3). A gzip file cut short: a problem for check, as generate stops."""
    import gzip

    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "hel')
    report = check([sim(2, context_length=CTX)], torn, tmp_path / "check", max_tokens=16)
    assert report["ok"] and report["plan"]["full"] == 1, report["problems"]
    [said] = [w for w in report["warnings"] if "line 2 of torn.jsonl has no newline" in w]
    outcome, _ = run_sim(torn, tmp_path / "run", {"n_ports": 2, "context_length": CTX}, max_tokens=16)
    assert outcome.exit_code == 3 and outcome.summary["completed"] == 1
    assert [w for w in outcome.summary["warnings"] if "has no newline" in w] == [said.split(": generate exits")[0]]

    rows = b"".join(orjson.dumps(r) + b"\n" for r in prompts(50))
    cut = tmp_path / "cut.jsonl.gz"
    packed = gzip.compress(rows)
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    report = check([sim(2, context_length=CTX)], cut, tmp_path / "check-cut", max_tokens=16)
    assert not report["ok"]
    assert any(p.startswith(f"cannot read {cut} after line") and "(exit 1)" in p for p in report["problems"])
