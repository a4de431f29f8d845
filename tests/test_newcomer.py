"""The messages a newcomer meets in a first hour: each says in one line what is wrong and what to do.
(`status` during an outage: tests/test_progress.py::test_status_says_waiting_for_servers_during_an_outage.)"""

from __future__ import annotations

import logging

import orjson
import pytest
from e2e import fleet_in_thread, prompts, run_sim

from gen_pipeline.cli import config_from_args, main, parse_argv
from gen_pipeline.errors import ConfigError
from gen_pipeline.sim import SimConfig, free_ports
from gen_pipeline.tokens import TINY_TOKENIZER, load_counter


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../shared/tokenizers/qwen33", "is no folder here (nor a hub name): give --tokenizer a folder holding"),
        ("/models/Qwen3-8B", "is no folder here"),
        (str(TINY_TOKENIZER / "tokenizer.json"), "is a file: give --tokenizer the folder that holds it"),
    ],
)
def test_a_mistyped_tokenizer_path_says_so(name, message):
    """A path that is no folder is not sent to the hub (its "Repo id must be in the form ..." error)."""
    with pytest.raises(ConfigError) as raised:
        load_counter(name)
    text = str(raised.value)
    assert message in text and "Repo id" not in text and "\n" not in text


def test_an_empty_tokenizer_folder_says_what_it_lacks(tmp_path):
    """A folder with no tokenizer files in it: not transformers' request for sentencepiece."""
    with pytest.raises(ConfigError) as raised:
        load_counter(str(tmp_path))
    text = str(raised.value)
    assert "holds no tokenizer (no tokenizer.json" in text and "sentencepiece" not in text and "\n" not in text


def test_a_mistyped_tokenizer_stops_generate_in_one_line(tmp_path, capsys):
    """generate --tokenizer with a typo: exit 1, one line, and no run directory left behind."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(3)))
    with fleet_in_thread(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as servers:
        argv = ["generate", "-i", str(inp), "-o", str(tmp_path / "run"), "-s", servers, "--progress", "off"]
        assert main([*argv, "--tokenizer", str(tmp_path / "tokenizerz" / "qwen3")]) == 1
    assert "is no folder here" in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_model_no_server_serves_is_a_warning_before_anything_is_sent(write_jsonl, tmp_path, caplog):
    """--model with a typo: SGLang answers under any name, so the run goes on, but it says so at the start
    (before the first request) and in the summary."""
    with caplog.at_level(logging.INFO, logger="gen_pipeline"):
        outcome, _ = run_sim(write_jsonl(prompts(4)), tmp_path / "out", {"n_ports": 2}, model="sim-modle")
    warning = "--model 'sim-modle' is served by no server (their /v1/models: sim-model)"
    assert outcome.exit_code == 0 and any(warning in w for w in outcome.summary["warnings"])
    started = [r for r in caplog.records if warning in r.getMessage()]
    assert started and started[0].getMessage().startswith("warning: ")
    correct, _ = run_sim(write_jsonl(prompts(2)), tmp_path / "ok", {"n_ports": 1}, model="sim-model")
    assert not any("served by no server" in w for w in correct.summary["warnings"])


def test_a_start_up_failure_leaves_no_empty_run_directory(tmp_path, capsys):
    """No server answering: exit 1 in one line, and the directory it made (parents too) is gone again; a
    directory that existed before stays, with what it held."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(2)))
    down = ["-s", f"127.0.0.1:{free_ports(1)[0]}", "--startup-timeout", "0.2", "--progress", "off"]
    assert main(["generate", "-i", str(inp), "-o", str(tmp_path / "new" / "run"), *down]) == 1
    assert "no server answered" in one_line_error(capsys)
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main(["generate", "-i", str(inp), "-o", str(kept), *down]) == 1
    assert (kept / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_no_empty_run_directory_with_workers_either(tmp_path, workers):
    """The same for the supervisor of --workers K."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(2)))
    down = ["-s", f"127.0.0.1:{free_ports(1)[0]}", "--startup-timeout", "0.2", "--progress", "off"]
    assert main(["generate", "-i", str(inp), "-o", str(tmp_path / "run"), *down, "--workers", workers]) == 1
    assert not (tmp_path / "run").exists()


def test_max_tokens_below_the_default_min_tokens_just_works():
    """--max-tokens 5 alone: --min-tokens (never set) follows it down, instead of an error naming a flag
    the user never gave; set both the wrong way round, the error says both values and what to do."""
    config = config_from_args(parse_argv(["generate", "-i", "p", "-o", "o", "--max-tokens", "5"]))
    assert (config.max_tokens, config.min_tokens) == (5, 5)
    assert config_from_args(parse_argv(["generate", "-i", "p", "-o", "o"])).min_tokens == 16
    with pytest.raises(ConfigError, match=r"^--min-tokens exceeds --max-tokens 5: lower it$"):
        config_from_args(parse_argv(["generate", "-i", "p", "-o", "o", "--max-tokens", "5", "--min-tokens", "20"]))


def test_max_tokens_5_from_the_command_line_exits_0(write_jsonl, tmp_path, capsys):
    """The whole command with --max-tokens 5 runs (it exited 1: "--min-tokens must not exceed --max-tokens")."""
    with fleet_in_thread(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as servers:
        argv = ["generate", "-i", str(write_jsonl(prompts(3))), "-o", str(tmp_path / "o"), "-s", servers]
        assert main([*argv, "--max-tokens", "5", "--progress", "off"]) == 0


def test_a_run_cut_at_max_tokens_ends_with_a_hint(write_jsonl, tmp_path):
    """Most answers ending at max_tokens: the summary's warnings say how many and to raise --max-tokens; a
    run whose answers finish has no such hint."""
    cut, _ = run_sim(write_jsonl(prompts(10)), tmp_path / "cut", {"n_ports": 1}, max_tokens=8, min_tokens=8)
    hint = [w for w in cut.summary["warnings"] if "stopped at their max_tokens" in w]
    cut_short = cut.summary["finish_reasons"]["length"]
    assert hint and hint[0].startswith(f"{cut_short} of 10 answers ({10 * cut_short}%)"), hint
    assert "raise --max-tokens (now 8)" in hint[0] and cut_short > 5
    whole, _ = run_sim(write_jsonl(prompts(10)), tmp_path / "whole", {"n_ports": 1}, max_tokens=512)
    assert not any("stopped at their max_tokens" in w for w in whole.summary["warnings"])


def test_the_hint_counts_only_answers_cut_at_their_own_budget():
    """Answers a server cut at its context are the server-cut warning's, not a reason to raise --max-tokens."""
    from gen_pipeline.tokens.findings import length_hint

    assert length_hint({"stop": 11, "length": 89}, 0, 64) is not None
    assert length_hint({"stop": 11, "length": 89}, 60, 64) is None  # 29 of 100 at their own budget
    assert length_hint({"stop": 60, "length": 40}, 0, 64) is None
    assert length_hint({}, 0, 64) is None
