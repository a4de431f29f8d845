"""What each server kind does with the run's response_format (fleet/structured.py), and `check` saying so up
front: enforced and how, refused (SGLang --grammar-backend none), or enforced with whitespace a model can fill
max_tokens with."""

from __future__ import annotations

from typing import Any

import pytest
from e2e import prompts
from test_check import check, sim

from gen_pipeline.fleet.structured import Grammar, asks_for_json, enforcement, findings
from gen_pipeline.preflight.check import render_check

SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}

# The constrained-decoding keys of SGLang 0.5.23's /server_info, as a server started with no such flag reports them.
SGLANG_DEFAULT = {
    "grammar_backend": "xgrammar",
    "constrained_json_whitespace_pattern": None,
    "constrained_json_disable_any_whitespace": False,
    "constrained_json_max_whitespace_cnt": None,
    "reasoning_parser": None,
}


def grammar(**changes: Any) -> Grammar | None:
    return Grammar.from_server_info({**SGLANG_DEFAULT, **changes})


@pytest.mark.parametrize(
    ("kind", "settings", "enforced", "whitespace"),
    [
        ("sglang", {}, True, "unbounded"),
        ("sglang", {"constrained_json_disable_any_whitespace": True}, True, "bounded"),
        ("sglang", {"constrained_json_max_whitespace_cnt": 4}, True, "bounded"),
        ("sglang", {"grammar_backend": "llguidance"}, True, "unbounded"),
        ("sglang", {"grammar_backend": "llguidance", "constrained_json_whitespace_pattern": "[ ]?"}, True, "unknown"),
        ("sglang", {"grammar_backend": "outlines"}, True, "bounded"),
        ("sglang", {"grammar_backend": "none"}, False, "unknown"),
        ("sglang", None, True, "unknown"),  # an SGLang that reports no grammar backend
        ("vllm", None, True, "unknown"),
        ("llamacpp", None, True, "bounded"),
        ("openai", None, None, "unknown"),
        (None, None, None, "unknown"),
    ],
)
def test_what_each_server_does_with_a_response_format(kind, settings, enforced, whitespace):
    """Enforced or not, and the whitespace its grammar lets through, by server kind and SGLang's settings."""
    found = enforcement(kind, None if settings is None else grammar(**settings))
    assert (found.enforced, found.whitespace) == (enforced, whitespace), found


def test_check_findings_name_the_server_and_the_flag_that_fixes_it():
    """A refusing SGLang is a problem; unbounded whitespace or a server not known to enforce is a warning;
    a bounded one, vLLM (it does not report) and llama.cpp are neither."""
    refused, _ = findings("http://a:1", "sglang", grammar(grammar_backend="none"))
    assert refused is not None and "http://a:1" in refused and "--grammar-backend none" in refused
    assert "ledgered bad_request" in refused
    _, loose = findings("http://a:1", "sglang", grammar())
    assert loose is not None and "--constrained-json-disable-any-whitespace" in loose and "max_tokens" in loose
    _, unknown = findings("http://b:2", "openai", None)
    assert unknown is not None and "not known to constrain" in unknown and "ledgered invalid" in unknown
    tight = grammar(constrained_json_disable_any_whitespace=True, reasoning_parser="qwen3")
    assert findings("http://a:1", "sglang", tight) == (None, None)
    assert enforcement("sglang", tight).how == "enforced by xgrammar (whitespace bounded), after the thinking"
    assert findings("http://c:3", "vllm", None) == findings("http://d:4", "llamacpp", None) == (None, None)


def test_only_a_json_response_format_is_judged():
    """--json-schema's response_format and a json_object one ask for JSON; a text one and none do not."""
    assert asks_for_json({"response_format": SCHEMA_FORMAT})
    assert asks_for_json({"response_format": {"type": "json_object"}})
    assert not asks_for_json({"response_format": {"type": "text"}}) and not asks_for_json({})


def test_check_says_how_each_server_enforces_the_schema(write_jsonl, tmp_path):
    """check with a response_format: each server's line says how it enforces it (the simulator reports
    SGLang's grammar keys as a compact-JSON server does); without one, nothing is said of it."""
    path = write_jsonl(prompts(4))
    report = check([sim(1)], path, tmp_path, sampling={"response_format": SCHEMA_FORMAT})
    assert report["ok"], report["problems"]
    [server] = report["fleet"]
    assert server["response_format"] == {
        "enforced": True,
        "whitespace": "bounded",
        "how": "enforced by xgrammar (whitespace bounded)",
    }
    assert "    response_format: enforced by xgrammar (whitespace bounded)" in render_check(report).splitlines()
    assert not [w for w in report["warnings"] if "response_format" in w or "whitespace" in w]
    plain = check([sim(1)], path, tmp_path)
    assert "response_format" not in plain["fleet"][0]


def test_generate_refuses_a_server_that_refuses_the_schema_and_warns_of_loose_whitespace(tmp_path):
    """generate at start: an SGLang on --grammar-backend none is refused (a PROBLEM, --force starts anyway), one
    with unbounded whitespace warned of; a run that asks for no JSON hears of neither."""
    import dataclasses

    from gen_pipeline.engine.setup import start_findings
    from gen_pipeline.errors import PreflightError
    from gen_pipeline.fleet.discovery import FleetInfo, ServerInfo
    from gen_pipeline.options import build_config

    def fleet() -> FleetInfo:
        return FleetInfo(
            servers=[
                ServerInfo("http://a:1", "m", 2048, kind="sglang", grammar=grammar(grammar_backend="none")),
                ServerInfo("http://b:2", "m", 2048, kind="sglang", grammar=grammar()),
            ],
            down=[],
        )

    config = build_config(tmp_path / "in.jsonl", tmp_path / "out", sampling={"response_format": SCHEMA_FORMAT})
    with pytest.raises(PreflightError, match="http://a:1 runs SGLang with --grammar-backend none"):
        start_findings(config, fleet())
    forced = fleet()
    start_findings(dataclasses.replace(config, force=True), forced)
    assert any(w.startswith("PROBLEM ignored (--force): http://a:1") for w in forced.warnings), forced.warnings
    assert any(w.startswith("http://b:2 (SGLang, xgrammar) lets any run of whitespace") for w in forced.warnings)
    plain = fleet()
    start_findings(build_config(tmp_path / "in.jsonl", tmp_path / "out"), plain)
    assert plain.warnings == []
