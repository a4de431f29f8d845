"""The answer checks: the hygiene checks every run has, --validate and --json-schema, built from the flags."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from gen_pipeline.answers.checks import Answer, answer_text
from gen_pipeline.answers.validate import Validator
from gen_pipeline.errors import ConfigError, ValidatorError
from gen_pipeline.options import build_config
from gen_pipeline.samples import answer_seed, sample_seed, turn_seed

CALL = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


@pytest.mark.parametrize(
    ("answer", "check"),
    [
        (Answer("the answer", finish_reason="stop"), None),
        (Answer("", tool_calls=CALL, finish_reason="tool_calls"), None),  # a tool call alone is an answer
        (Answer("thinking it over</think>\n\nthe answer"), None),  # no reasoning parser: the template opened it
        (Answer("<think>thinking</think>the answer"), None),
        (Answer("the answer", reasoning="thinking", finish_reason="length"), None),  # cut in the answer: kept
        (Answer("", reasoning="still thinking", finish_reason="length"), "unfinished_reasoning"),
        (Answer("<think>still thinking", finish_reason="length"), "unfinished_reasoning"),
        (Answer("", reasoning="thought it all", finish_reason="stop"), "empty"),
        (Answer("  \n", finish_reason="stop"), "empty"),
        (Answer("<think>only thinking</think>", finish_reason="stop"), "empty"),
        (Answer("the answer</think>", reasoning="thinking"), "think_marker"),
        (Answer("<think>a</think>the answer</think>"), "think_marker"),
        (Answer("<think>never closed, but stopped", finish_reason="stop"), "think_marker"),
        (Answer("answer <think> more"), "think_marker"),
    ],
)
def test_hygiene_checks_table(answer, check):
    """Each hygiene check refuses what a dataset would drop, under its own name; the rest passes."""
    verdict = Validator.build().verdict(answer)
    assert (verdict.check if verdict else None) == check, verdict


def test_answer_text_leaves_out_the_leading_thinking():
    """The text checks read the answer after a leading thinking block."""
    assert answer_text("<think>x</think> {}") == "{}"
    assert answer_text("x</think>\n[1]") == "[1]"
    assert answer_text(' {"a": 1} ') == '{"a": 1}'


@pytest.mark.parametrize(
    ("specs", "content", "check"),
    [
        (["json"], '{"a": 1}', None),
        (["json"], 'Here it is: ```json\n{"a": 1}\n```', "json"),
        (["json"], "<think>hmm</think>[1, 2]", None),
        (["regex:^\\d+$"], "42", None),
        (["regex:^\\d+$"], "about 42", "regex"),
        (["json", "regex:b"], '{"a": 1}', "regex"),  # in the order given, after json
        (["json", "regex:b"], "b", "json"),
    ],
)
def test_validate_kinds_table(specs, content, check):
    """--validate json and regex:PATTERN (re.search) refuse an answer with their own names, in order."""
    verdict = Validator.build(specs).verdict(Answer(content, finish_reason="stop"))
    assert (verdict.check if verdict else None) == check


def test_text_checks_pass_a_tool_call_answer():
    """An answer made only of tool calls has no text for json or a schema to read."""
    answer = Answer("", tool_calls=CALL, finish_reason="tool_calls")
    assert Validator.build(["json", "regex:x"], {"type": "object"}).verdict(answer) is None


def test_json_schema_is_checked_with_jsonschema():
    """--json-schema: JSON that the schema refuses names where it failed."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    validator = Validator.build((), schema)
    assert validator.verdict(Answer('{"n": 3}', finish_reason="stop")) is None
    bad = validator.verdict(Answer('{"n": "three"}', finish_reason="stop"))
    assert bad is not None and bad.check == "schema" and "at n" in bad.detail
    assert validator.verdict(Answer("n is 3", finish_reason="stop")).check == "schema"  # type: ignore[union-attr]


def write_module(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "mychecks.py"
    path.write_text(body)
    return path


def test_python_validator_gets_the_answer_and_returns_a_reason(tmp_path):
    """python:FILE.py:FUNCTION gets the Answer (text, row, sample) and returns None or a reason."""
    path = write_module(
        tmp_path,
        "def short(answer):\n"
        "    if len(answer.text) > 5:\n"
        "        return f'too long for id {answer.id} sample {answer.sample}: {len(answer.text)}'\n",
    )
    validator = Validator.build([f"python:{path}:short"])
    assert validator.verdict(Answer("tiny", id="a")) is None
    verdict = validator.verdict(Answer("far too long", id="a", sample=2))
    assert verdict == ("python", "too long for id a sample 2: 12")


def test_a_module_in_the_working_directory_or_beside_the_file_imports(tmp_path, monkeypatch):
    """python:MODULE:F finds MODULE in the working directory as `python -m` does, and python:FILE.py:F the
    modules beside FILE as `python FILE` does, though the `gen-pipeline` console script has neither on its
    path ("No module named 'mychecks'" before)."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(Path.cwd()))])
    here, beside = tmp_path / "here", tmp_path / "checks"
    here.mkdir(), beside.mkdir()
    (here / "qa_cwd_checks.py").write_text("def f(answer):\n    return None if answer.text else 'empty'\n")
    (beside / "qa_beside_words.py").write_text("BANNED = 'forbidden'\n")
    (beside / "qa_beside_checks.py").write_text(
        "import qa_beside_words\n\n"
        "def f(answer):\n    return 'banned' if qa_beside_words.BANNED in answer.text else None\n"
    )
    monkeypatch.chdir(here)
    assert Validator.build(["python:qa_cwd_checks:f"]).verdict(Answer("fine")) is None
    validator = Validator.build([f"python:{beside / 'qa_beside_checks.py'}:f"])
    assert validator.verdict(Answer("a forbidden word")) == ("python", "banned")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def f(answer):\n    raise KeyError('meta')\n", "raised KeyError"),
        ("def f(answer):\n    return True\n", "returned True"),
        ("def f(answer):\n    return answer.meta['missing']\n", "raised KeyError"),
    ],
)
def test_a_failing_python_validator_is_never_a_bad_answer(tmp_path, body, message):
    """A function that raises, or returns neither None nor a str, is its own fault: ValidatorError."""
    path = write_module(tmp_path, body)
    with pytest.raises(ValidatorError, match=message):
        Validator.build([f"python:{path}:f"]).verdict(Answer("an answer", id=7))


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["xml"], "json, regex:PATTERN or python:MODULE:FUNCTION"),
        (["regex:("], "not a regular expression"),
        (["regex:"], "json, regex:PATTERN"),
        (["python:nomodule"], "json, regex:PATTERN"),
        (["python:gen_pipeline_no_such_module:f"], "cannot import"),
        (["python:json:no_such_function"], "has no function"),
    ],
)
def test_bad_validate_flags_are_refused_before_the_run(tmp_path, specs, message):
    """A --validate value that cannot work is a ConfigError when the config is built."""
    with pytest.raises(ConfigError, match=message):
        build_config(tmp_path / "in.jsonl", tmp_path / "out", validate=specs)


def test_json_schema_is_sent_as_response_format(tmp_path):
    """--json-schema FILE: the schema goes out as response_format (json_schema, named after the file)."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    path = tmp_path / "answer schema.json"
    path.write_bytes(orjson.dumps(schema))
    config = build_config(tmp_path / "in.jsonl", tmp_path / "out", json_schema=str(path), validate="json")
    assert config.sampling["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer_schema", "schema": schema},
    }
    assert config.json_schema == schema and config.validate == ("json",)
    with pytest.raises(ConfigError, match="keep one"):
        build_config(tmp_path / "in.jsonl", tmp_path / "o", json_schema=schema, sampling={"response_format": {}})
    with pytest.raises(ConfigError, match="not a valid JSON Schema"):
        build_config(tmp_path / "in.jsonl", tmp_path / "o", json_schema={"type": "no such type"})
    path.write_text("[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        build_config(tmp_path / "in.jsonl", tmp_path / "o", json_schema=str(path))


def test_max_resamples_must_not_be_negative(tmp_path):
    with pytest.raises(ConfigError, match="--max-resamples"):
        build_config(tmp_path / "in.jsonl", tmp_path / "out", max_resamples=-1)


def test_answer_seeds_are_reproducible_and_each_resample_is_another_draw():
    """Attempt 0 keeps the sample's (or turn's) seed; each resample hashes the attempt in."""
    assert answer_seed(7, "a", 2, 0, 0) == sample_seed(7, "a", 2)
    assert answer_seed(7, "a", 2, 3, 0) == turn_seed(7, "a", 2, 3)
    seeds = {answer_seed(7, "a", 2, 0, attempt) for attempt in range(5)}
    assert len(seeds) == 5 and answer_seed(7, "a", 2, 0, 1) == answer_seed(7, "a", 2, 0, 1)
    assert answer_seed(7, "a", 2, 0, 1) != answer_seed(7, "a", 2, 1, 1) != answer_seed(8, "a", 2, 1, 1)


def test_check_warns_of_validate_json_without_a_response_format(write_jsonl, tmp_path):
    """`check` warns when --validate json has nothing constraining the answers to JSON; not with a schema."""
    from test_check import check, sim

    from gen_pipeline.answers.validate import unconstrained_json

    path = write_jsonl([{"id": 1, "prompt": "say hi"}])
    report = check([sim(1)], path, tmp_path, validate=("json",))
    assert any("--validate json with no response_format" in w for w in report["warnings"]), report["warnings"]
    config = build_config(path, tmp_path / "o", validate="json", json_schema={"type": "object"})
    assert unconstrained_json(config.validate, config.sampling) is None
    assert unconstrained_json(("regex:x",), {}) is None


def test_a_looping_text_is_kept_as_its_head_and_two_units():
    """shortened: the head, two copies of the repeated unit, and how much was left out; other texts unchanged."""
    from gen_pipeline.answers.shorten import shortened

    head, unit = "Let me think about the sum. ", "so the answer is 42, but wait, "
    text = head + unit * 300
    short = shortened(text)
    kept = short[: short.index("[...")]
    assert kept.startswith(head.strip()) and kept.count("so the answer is 42") == 2
    assert len(kept) == len(head) - 1 + 2 * len(unit)  # the loop begins with the space that ends the head
    assert short.endswith(f"more characters repeating the last {len(unit)} ...]")
    assert len(kept) + int(short.split("[... ")[1].split()[0]) == len(text)
    plain = "one two three " * 10 + "".join(f"{i}, " for i in range(400))  # a count: no loop
    assert shortened(plain) == plain and shortened("short") == "short"
