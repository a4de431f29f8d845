"""The answer checks against the real servers: SGLang 0.5.23 and vLLM on CPU, and llama.cpp.

The tiny random Qwen3 writes gibberish, so a JSON answer comes out only where the server constrains it:
- `--json-schema` is sent as `{"type": "json_schema", "json_schema": {"name", "schema"}}`; each server takes that
  shape and enforces it, every row is written and passes the jsonschema check, and `check` says how each server
  enforces it (fleet/structured.py);
- an SGLang that lets any run of whitespace stand between the JSON's tokens (its default) is warned of by
  `check`; the random model fills max_tokens with whitespace there, so its rows end `invalid` after the bound,
  every attempt in rejected.jsonl;
- `--validate json` with no schema: every answer is rejected, resampled with its derived seeds up to the bound,
  and ledgered `invalid`, each attempt kept and counted.

One class per server kind, its servers started for the class alone (class-scoped fixtures), so a run of the
file has one kind up at a time: ~2-3 min for SGLang (two servers), ~2.5-4 min for vLLM, under a minute for
llama.cpp on two busy cores. Needs what the other realserver files need (their helpers and caches are reused);
skipped with the reason when it is absent, unless GEN_PIPELINE_REALSERVER=1 asks for it (then a failure).
Thinking is off in these runs: SGLang with a reasoning parser and llama.cpp start the grammar where the thinking
ends, and the random model never ends it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import test_realserver as llama_tests
import test_realserver_sglang as sglang_tests
import test_realserver_vllm as vllm_tests
from conftest import QWEN3
from e2e import prompts, read_jsonl

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.modes import run_async
from gen_pipeline.options import build_config
from gen_pipeline.preflight.check import run_check
from gen_pipeline.samples import answer_seed
from gen_pipeline.sim import free_ports

pytestmark = [pytest.mark.realserver, pytest.mark.slow]

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
SENT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
SEED = 7
BOUND = 2  # --max-resamples: each answer is sent at most 3 times
SGLANG_COMPACT = ["--constrained-json-disable-any-whitespace"]
# Two SGLang servers loading at once on one machine: each profiles the memory left after loading its weights,
# and the other's load counts against it (seen: "Loaded weights leave no GPU memory for the KV cache under
# --mem-fraction-static=0.05 ... minimum viable 0.0536"). The KV pool stays --max-total-tokens 8192 either way.
SGLANG_ROOM = ["--mem-fraction-static", "0.15"]
VLLM_COMPACT = ["--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']


def _missing(paths: list[Path], fix: str) -> None:
    """Skip (or, under GEN_PIPELINE_REALSERVER=1, fail) when a server's files are not in the cache."""
    missing = [str(p) for p in paths if not p.exists()]
    if not missing:
        return
    reason = f"missing ({', '.join(missing)}); {fix}"
    if os.environ.get("GEN_PIPELINE_REALSERVER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def config(inp: Path, out: Path, urls: tuple[str, ...], tokenizer: str, **options: Any) -> RunConfig:
    """generate's options as its flags give them, thinking off, retries instant."""
    settings = {"max_tokens": 64, "min_tokens": 1, "progress": "off", "seed": SEED, "max_resamples": BOUND}
    built = build_config(
        inp, out, servers=list(urls), tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False},
        **{**settings, **options},
    )  # fmt: skip
    return dataclasses.replace(built, retry=RetryPolicy.testing())


def run(cfg: RunConfig, timeout: float = 600) -> Any:
    return asyncio.run(asyncio.wait_for(run_async(cfg), timeout))


def check(cfg: RunConfig) -> dict[str, Any]:
    return asyncio.run(asyncio.wait_for(run_check(cfg), 300))


def assert_enforced(outcome: Any, out: Path, rows: int) -> list[dict[str, Any]]:
    """Every row written, each answer the schema's, sent with the response_format as measured; an answer is
    rejected only where max_tokens cut its JSON. The lines."""
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {}, outcome.summary
    done = read_jsonl(out / "completions.jsonl")
    assert len(done) == outcome.summary["completed"] == rows
    for line in done:
        jsonschema.validate(orjson.loads(line["completion"]), SCHEMA)
        assert line["sampling"]["response_format"] == SENT
    assert all(r["finish_reason"] == "length" for r in read_jsonl(out / "rejected.jsonl"))
    return done


def assert_resampled_to_the_bound(outcome: Any, out: Path, ids: list[str]) -> None:
    """--validate json on gibberish: each row's 1 + BOUND answers rejected (each with its own derived seed,
    each another draw), then ledgered invalid; the summary counts every attempt and its tokens."""
    assert outcome.summary["completed"] == 0 and outcome.summary["failed"] == {"invalid": len(ids)}, outcome.summary
    kept = read_jsonl(out / "rejected.jsonl")
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in kept:
        by_id[str(r["id"])].append(r)
    assert sorted(by_id) == sorted(ids) and len(kept) == len(ids) * (BOUND + 1)
    for rid, attempts in by_id.items():
        attempts.sort(key=lambda r: r["attempt"])
        assert [r["attempt"] for r in attempts] == list(range(BOUND + 1))
        assert [r["seed"] for r in attempts] == [answer_seed(SEED, rid, 0, 0, a) for a in range(BOUND + 1)]
        assert len({r["seed"] for r in attempts}) == BOUND + 1
        assert len({r["completion"] for r in attempts}) > 1, attempts  # another seed, another draw
        assert {(r["reason"], r["check"]) for r in attempts} == {("invalid", "json")}
    ledger = {str(r["id"]): r for r in read_jsonl(out / "failures.jsonl")}
    assert sorted(ledger) == sorted(ids)
    assert all(r["reason"] == "invalid" and r["attempts"] == BOUND + 1 for r in ledger.values())
    assert outcome.summary["answers"] == {
        "attempts": len(kept),
        "rejected": {"invalid": len(kept)},
        "rejected_by_check": {"json": len(kept)},
        "rejected_tokens": sum(r["completion_tokens"] for r in kept),
    }


def validate_json_rows(write_jsonl: Any, n: int = 4) -> tuple[Path, list[str]]:
    rows = prompts(n)
    return write_jsonl(rows, "validate.jsonl"), [str(r["id"]) for r in rows]


# SGLang 0.5.23: one server with compact JSON, one as started by default


@pytest.fixture(scope="class")
def sglang(tmp_path_factory):
    """Two SGLang servers (no parser): `--constrained-json-disable-any-whitespace` on the first, the default
    (any whitespace) on the second; stopped after the class."""
    _missing([sglang_tests.PYTHON, sglang_tests.MODEL / "config.json"], "run run/sglang/setup.sh TOKENIZER_DIR")
    serve, run_dir = sglang_tests._serve(), tmp_path_factory.mktemp("sglang-answers")
    try:
        with ThreadPoolExecutor(2) as pool:
            starts = [pool.submit(serve.start, str(sglang_tests.PYTHON), sglang_tests.MODEL, port, run_dir,
                                  sglang_tests.CTX, [*SGLANG_ROOM, *extra], 900)
                      for port, extra in zip(free_ports(2), (SGLANG_COMPACT, []), strict=True)]  # fmt: skip
            urls = tuple(f.result() for f in starts)
        wait_healthy(urls, 300)
        yield urls
    finally:
        serve.stop(run_dir)


def wait_healthy(urls: tuple[str, ...], timeout: float) -> None:
    """Until each server's /health answers 200: SGLang says 503 there for a while after /v1/models answers
    (its warm-up), and `check` counts that as unhealthy."""
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
                    if answer.status == 200:
                        break
            except OSError:  # urllib's HTTPError (the 503) and refused connections alike
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url}/health did not answer 200 within {timeout:.0f} s")
            time.sleep(1)


class TestSGLang:
    """SGLang constrains the answer with xgrammar; how much whitespace it allows is the server's flag."""

    def test_json_schema_is_enforced_and_every_row_written(self, sglang, write_jsonl, tmp_path):
        """check: enforced by xgrammar, whitespace bounded; every row written with an answer of the schema."""
        out = tmp_path / "out"
        cfg = config(write_jsonl(prompts(8)), out, sglang[:1], str(sglang_tests.MODEL), json_schema=SCHEMA)
        report = check(cfg)
        assert report["ok"], report["problems"]
        assert report["fleet"][0]["response_format"] == {
            "enforced": True,
            "whitespace": "bounded",
            "how": "enforced by xgrammar (whitespace bounded)",
        }
        assert not [w for w in report["warnings"] if "whitespace" in w], report["warnings"]
        assert_enforced(run(cfg), out, 8)

    def test_unbounded_whitespace_is_warned_of_and_its_rows_end_invalid(self, sglang, write_jsonl, tmp_path):
        """The default SGLang: check warns up front; the random model spends max_tokens on whitespace inside the
        JSON, so each answer is rejected (schema: not JSON), resampled, and the row ledgered invalid."""
        out = tmp_path / "out"
        cfg = config(write_jsonl(prompts(3)), out, sglang[1:], str(sglang_tests.MODEL), json_schema=SCHEMA,
                     max_tokens=32, max_resamples=1)  # fmt: skip
        report = check(cfg)
        assert report["fleet"][0]["response_format"]["whitespace"] == "unbounded"
        [warning] = [w for w in report["warnings"] if "whitespace" in w]
        assert sglang[1] in warning and "--constrained-json-disable-any-whitespace" in warning
        outcome = run(cfg)
        kept = read_jsonl(out / "rejected.jsonl")
        assert outcome.summary["failed"] == {"invalid": 3} and len(kept) == 3 * 2, outcome.summary
        assert all((r["check"], r["finish_reason"]) == ("schema", "length") for r in kept)
        assert all(not r["completion"].strip() or r["completion"].lstrip().startswith("{") for r in kept)

    def test_validate_json_resamples_to_the_bound_then_ledgers_invalid(self, sglang, write_jsonl, tmp_path):
        """--validate json, no schema: gibberish, rejected and resampled BOUND times, then ledgered invalid."""
        inp, ids = validate_json_rows(write_jsonl)
        out = tmp_path / "out"
        outcome = run(config(inp, out, sglang, str(sglang_tests.MODEL), validate="json", max_tokens=8))
        assert_resampled_to_the_bound(outcome, out, ids)


# vLLM on CPU, started with compact JSON


@pytest.fixture(scope="class")
def vllm(tmp_path_factory):
    """One vLLM server whose structured outputs write compact JSON; stopped after the class."""
    _missing([vllm_tests.PYTHON, vllm_tests.MODEL / "config.json"], "run run/vllm/setup.sh TOKENIZER_DIR")
    run_dir = tmp_path_factory.mktemp("vllm-answers")
    serve = vllm_tests.vllm
    try:
        yield serve.start(str(vllm_tests.PYTHON), vllm_tests.MODEL, free_ports(1)[0], run_dir, vllm_tests.CTX, 900,
                          VLLM_COMPACT)  # fmt: skip
    finally:
        serve.stop(run_dir)


class TestVLLM:
    """vLLM constrains the answer with its structured outputs; it does not report its whitespace setting."""

    def test_json_schema_is_enforced_and_every_row_written(self, vllm, write_jsonl, tmp_path):
        """check: enforced by its structured outputs (whitespace not reported, no warning); every row written."""
        out = tmp_path / "out"
        cfg = config(write_jsonl(prompts(8)), out, (vllm,), str(vllm_tests.MODEL), json_schema=SCHEMA)
        report = check(cfg)
        assert report["ok"], report["problems"]
        view = report["fleet"][0]["response_format"]
        assert (view["enforced"], view["whitespace"]) == (True, "unknown") and "structured outputs" in view["how"]
        assert not [w for w in report["warnings"] if "whitespace" in w or "response_format" in w]
        assert_enforced(run(cfg), out, 8)

    def test_validate_json_resamples_to_the_bound_then_ledgers_invalid(self, vllm, write_jsonl, tmp_path):
        """--validate json, no schema: gibberish, rejected and resampled BOUND times, then ledgered invalid."""
        inp, ids = validate_json_rows(write_jsonl)
        out = tmp_path / "out"
        outcome = run(config(inp, out, (vllm,), str(vllm_tests.MODEL), validate="json", max_tokens=8))
        assert_resampled_to_the_bound(outcome, out, ids)


# llama.cpp (llama-server --jinja)


@pytest.fixture(scope="class")
def llama(tmp_path_factory):
    """One llama-server with 4 slots of 2048 tokens; stopped after the class."""
    llama_tests._require()
    run_dir = tmp_path_factory.mktemp("llama-answers")
    fleet = llama_tests.llama
    started = fleet.start_fleet(llama_tests.MODEL, free_ports(1), run_dir, parallel=4, ctx_per_slot=llama_tests.CTX,
                                extra_args=["--jinja"], log=lambda _: None)  # fmt: skip
    try:
        yield tuple(s.url for s in started)
    finally:
        fleet.stop_fleet(run_dir, log=lambda _: None)


def llama_tokenizer() -> str:
    for path in (QWEN3, llama_tests.REBUILT_TOKENIZER):
        if (path / "tokenizer.json").exists():
            return str(path)
    pytest.skip("no Qwen3 tokenizer: run run/llama/build_qwen3_tokenizer.py")


class TestLlamaCpp:
    """llama.cpp constrains the answer with a grammar built from the schema, its whitespace bounded."""

    def test_json_schema_is_enforced_and_every_row_written(self, llama, write_jsonl, tmp_path):
        """check: enforced by a grammar, whitespace bounded; every row written with an answer of the schema."""
        out = tmp_path / "out"
        cfg = config(write_jsonl(prompts(8)), out, llama, llama_tokenizer(), json_schema=SCHEMA)
        report = check(cfg)
        assert report["ok"], report["problems"]
        view = report["fleet"][0]["response_format"]
        assert (view["enforced"], view["whitespace"]) == (True, "bounded"), view
        assert not [w for w in report["warnings"] if "whitespace" in w or "response_format" in w]
        assert_enforced(run(cfg), out, 8)

    def test_validate_json_resamples_to_the_bound_then_ledgers_invalid(self, llama, write_jsonl, tmp_path):
        """--validate json, no schema: gibberish, rejected and resampled BOUND times, then ledgered invalid."""
        inp, ids = validate_json_rows(write_jsonl)
        out = tmp_path / "out"
        outcome = run(config(inp, out, llama, llama_tokenizer(), validate="json", max_tokens=8))
        assert_resampled_to_the_bound(outcome, out, ids)
