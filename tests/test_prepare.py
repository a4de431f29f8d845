"""Tests of `prepare` and `formats`: format detection, normalization, dedup, exclusion, sources."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline import cli
from gen_pipeline.cli import prepare as cli_prepare
from gen_pipeline.errors import ConfigError
from gen_pipeline.inputs.formats import InvalidRowError, RowConverter, detect_format
from gen_pipeline.inputs.rows import RowError, parse_row
from gen_pipeline.prepare import convert as prepare
from gen_pipeline.prepare.convert import valid_line
from gen_pipeline.records import Completion, Failure, content_id

U = "user"


def msgs(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in turns]


def infinity_row(i: int, question: str, answer: str = "Sure.") -> dict[str, Any]:
    """A row shaped like BAAI/Infinity-Instruct."""
    return {
        "id": i,
        "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}],
        "label": {"ability_en": ["math"], "cate_ability_en": ["logic"]},
        "langdetect": "en",
        "source": "sharegpt",
    }


def run_prepare(*argv: Any) -> int:
    parser = argparse.ArgumentParser()
    cli_prepare.add_arguments(parser)
    return cli_prepare.main(parser.parse_args([str(a) for a in argv]))


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.mark.parametrize(
    ("raw", "fmt", "messages", "reference"),
    [
        (
            {"messages": msgs(("system", "Be brief."), (U, "Hi"), ("assistant", "Hello"))},
            "messages",
            msgs(("system", "Be brief."), (U, "Hi")),
            "Hello",
        ),
        (infinity_row(7, "What is 2+2?", "4"), "sharegpt", msgs((U, "What is 2+2?")), "4"),
        (
            {"conversations": [{"role": "user", "content": "Hey"}]},
            "sharegpt",
            msgs((U, "Hey")),
            None,
        ),
        (
            {"instruction": "Translate.", "input": "bonjour", "output": "hello"},
            "alpaca",
            msgs((U, "Translate.\n\nbonjour")),
            "hello",
        ),
        (
            {"instruction": "Add 2 and 2.", "input": "", "output": "4"},
            "alpaca",
            msgs((U, "Add 2 and 2.")),
            "4",
        ),
        ({"prompt": "Tell a joke.", "response": "No."}, "prompt", msgs((U, "Tell a joke.")), "No."),
        (
            {"prompt": msgs(("system", "S"), (U, "Q"))},
            "prompt",
            msgs(("system", "S"), (U, "Q")),
            None,
        ),
        ({"text": "Once upon a time"}, "text", msgs((U, "Once upon a time")), None),
    ],
)
def test_each_format_is_detected_and_normalized(raw, fmt, messages, reference):
    """Every supported format becomes role/content messages ending at the last user turn."""
    assert detect_format(raw) == fmt
    converted = RowConverter(keep_reference=True)(raw)
    assert converted.row["messages"] == messages
    assert converted.row.get("reference") == reference
    assert converted.row["id"] == raw.get("id", content_id(messages))  # a row's own id, else its content id


def test_infinity_instruct_row_keeps_its_id_and_columns():
    """The source's id stays the row's id; other columns are carried; the old answer is dropped."""
    row = RowConverter()(infinity_row(42, "Why is the sky blue?")).row
    assert row["id"] == 42 and "source_id" not in row
    assert row["label"] == {"ability_en": ["math"], "cate_ability_en": ["logic"]}
    assert (row["langdetect"], row["source"]) == ("en", "sharegpt")
    assert "reference" not in row and "conversations" not in row


def test_multi_turn_keeps_everything_up_to_the_last_user_turn():
    """Earlier answers stay (they are context); only the final answer is cut."""
    turns = [("human", "A"), ("gpt", "B"), ("human", "C"), ("gpt", "D")]
    raw = {"conversations": [{"from": f, "value": v} for f, v in turns]}
    converted = RowConverter(keep_reference=True)(raw)
    assert converted.row["messages"] == msgs((U, "A"), ("assistant", "B"), (U, "C"))
    assert converted.row["reference"] == "D"


def test_empty_system_turn_is_dropped():
    """ShareGPT dumps often carry an empty system turn; it is not a reason to reject the row."""
    raw = {"conversations": [{"from": "system", "value": ""}, {"from": "human", "value": "Q"}]}
    assert RowConverter()(raw).row["messages"] == msgs((U, "Q"))


def test_format_flag_overrides_the_guess():
    """--format picks the column when a row would fit several formats."""
    raw = {"prompt": "from prompt", "text": "from text"}
    assert RowConverter()(raw).row["messages"] == msgs((U, "from prompt"))
    assert RowConverter("text")(raw).row["messages"] == msgs((U, "from text"))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "not_json_object"),
        ([1, 2], "not_json_object"),
        ({"foo": "bar"}, "unknown_format"),
        ({"messages": []}, "no_messages"),
        ({"messages": msgs(("assistant", "only an answer"))}, "no_user_turn"),
        ({"messages": msgs(("robot", "beep"), (U, "hi"))}, "bad_role"),
        ({"messages": msgs((U, "   "))}, "empty_content"),
        ({"messages": [{"role": U, "content": 5}]}, "bad_content"),
        (
            {"messages": [{"role": U, "content": [{"type": "image_url", "image_url": {}}]}]},
            "non_text_content",
        ),
        ({"conversations": [{"from": "alien", "value": "x"}, {"from": "human", "value": "hi"}]}, "bad_role"),
        ({"text": ""}, "empty_content"),
    ],
)
def test_invalid_rows_are_rejected_with_a_reason(raw, reason):
    """Each kind of bad row has its own reason tag for the report: the format's, or the validator's that
    generate reads the row with."""
    with pytest.raises(InvalidRowError) as info:
        valid_line(RowConverter()(raw).row)
    assert info.value.reason == reason


def test_text_content_parts_are_kept_as_given():
    """OpenAI content parts that are all text are written as they are: the server joins them, as it does
    for any row generate sends (its own way: SGLang with a space, vLLM with a newline)."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    row = RowConverter()({"messages": [{"role": U, "content": parts}]}).row
    assert row["messages"] == [{"role": U, "content": parts}]
    assert parse_row(valid_line(row), 1).messages == row["messages"]


def test_dedup_collapses_whitespace_and_unicode_variants_but_not_roles(tmp_path, write_jsonl, capsys):
    """NFC and collapsed whitespace compare equal; the same text under another role does not."""
    src = write_jsonl(
        [
            {"messages": msgs((U, "Café  au lait?"))},
            {"messages": msgs((U, " Cafe\u0301 au\tlait? \n"))},  # decomposed é, other whitespace
            {"conversations": [{"from": "human", "value": "Café au lait?"}]},
            {"messages": msgs(("system", "Be brief."), (U, "Hi"))},
            {"messages": msgs((U, "Be brief."), (U, "Hi"))},
            b'{"messages": [{"role": "user", "content": "torn',
        ]
    )
    out, report = tmp_path / "prompts.jsonl", tmp_path / "report.json"
    assert run_prepare("--input", src, "--out", out, "--report", report) == 0
    rows = read_rows(out)
    # two user turns in a row are one turn (joined by a blank line): still not the system + user row
    assert [r["messages"][-1]["content"] for r in rows] == ["Café  au lait?", "Hi", "Be brief.\n\nHi"]
    assert len({r["id"] for r in rows}) == 3
    counts = orjson.loads(report.read_bytes())
    assert (counts["read"], counts["duplicates"], counts["written"]) == (6, 2, 3)
    assert counts["invalid_reasons"] == {"not_json": 1}
    assert "duplicates 2" in capsys.readouterr().out


def test_blank_lines_are_skipped_and_a_line_that_is_not_json_is_named_so(tmp_path, write_jsonl):
    """As generate reads a file: blank lines are no rows (they were counted invalid), a line that is not JSON
    is `not_json` (it was `not_json_object`, the reason for a JSON array or string), an array `not_json_object`."""
    src = write_jsonl([{"prompt": "a"}, b"", b"   ", {"prompt": "b"}, b"not json", b"[1, 2]"])
    out, report = tmp_path / "prompts.jsonl", tmp_path / "report.json"
    assert run_prepare("--input", src, "--out", out, "--report", report) == 0
    counts = orjson.loads(report.read_bytes())
    assert (counts["read"], counts["written"]) == (4, 2)
    assert counts["invalid_reasons"] == {"not_json": 1, "not_json_object": 1}


def test_an_id_beyond_64_bits_is_kept_as_its_digits(tmp_path, write_jsonl):
    """orjson reads an integer beyond 64 bits as a float (1.1805916207174113e+21: digits lost); the source id
    is written as the string of its digits, as generate wants such ids, and 64-bit ones stay integers."""
    big = b'{"id": 1180591620717411303424, "prompt": "x", "n": 18446744073709551615}'
    src = write_jsonl([big, {"id": 12, "prompt": "y"}, {"id": 9223372036854775807, "prompt": "z"}])
    out = tmp_path / "prompts.jsonl"
    assert run_prepare("--input", src, "--out", out) == 0
    rows = read_rows(out)
    assert [r["id"] for r in rows] == ["1180591620717411303424", 12, 9223372036854775807]
    assert rows[0]["n"] == 18446744073709551615


def test_ids_are_stable_across_runs(tmp_path, write_jsonl):
    """The same prompt without an id gets the same content id in every run, whatever its format."""
    a = write_jsonl([{"conversations": [{"from": "human", "value": "Same question"}]}], "a.jsonl")
    b = write_jsonl([{"messages": msgs((U, " Same  question "))}], "b.jsonl")
    run_prepare("--input", a, "--out", tmp_path / "a_out.jsonl")
    run_prepare("--input", b, "--out", tmp_path / "b_out.jsonl")
    assert read_rows(tmp_path / "a_out.jsonl")[0]["id"] == read_rows(tmp_path / "b_out.jsonl")[0]["id"]


def write_run(run: Path, done: list[str], failed: list[tuple[str, str]]) -> None:
    """A run directory as generate leaves it, with a torn last completion line."""
    run.mkdir()
    with (run / "completions.jsonl").open("wb") as f:
        for q in done:
            m = msgs((U, q))
            c = Completion(content_id(m), m, "ans", "stop", 3, 3, 1, 64, "s", 1, 0.1, "m", {})
            f.write(c.to_line())
        f.write(b'{"id": "torn", "messages": [{"role": "us')
    with (run / "failures.jsonl").open("wb") as f:
        for q, reason in failed:
            f.write(Failure(content_id(msgs((U, q))), 1, reason, "detail").to_line())


def test_exclude_drops_prompts_in_earlier_files_and_runs(tmp_path, write_jsonl):
    """Earlier prompt files, run outputs and permanent ledger ids are excluded; transient not."""
    earlier = write_jsonl([{"id": "x", "messages": msgs((U, "in an earlier file"))}], "earlier.jsonl")
    write_run(tmp_path / "run", ["already done"], [("too long", "over_length"), ("timed out", "timeout")])
    questions = ["in an earlier file", "already  done", "too long", "timed out", "brand new"]
    src = write_jsonl([infinity_row(i, q) for i, q in enumerate(questions)], "new.jsonl")
    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    run_prepare(
        "--input",
        src,
        "--out",
        out,
        "--exclude",
        earlier,
        "--exclude",
        tmp_path / "run",
        "--report",
        report,
    )
    assert [r["messages"][0]["content"] for r in read_rows(out)] == ["timed out", "brand new"]
    counts = orjson.loads(report.read_bytes())
    assert (counts["excluded"], counts["written"]) == (3, 2)


def test_exclude_of_a_folder_reads_every_jsonl_in_it(tmp_path, write_jsonl):
    """A folder that is not a run directory stands for its *.jsonl prompt files."""
    (tmp_path / "prompts").mkdir()
    write_jsonl([{"messages": msgs((U, "old"))}], "prompts/night-1.jsonl")
    src = write_jsonl([{"messages": msgs((U, "old"))}, {"messages": msgs((U, "new"))}], "src.jsonl")
    run_prepare("--input", src, "--out", tmp_path / "out.jsonl", "--exclude", tmp_path / "prompts")
    assert [r["messages"][0]["content"] for r in read_rows(tmp_path / "out.jsonl")] == ["new"]


def test_a_failed_run_leaves_the_old_output_in_place(tmp_path, write_jsonl):
    """The output is replaced only when every source was read; no .tmp file is left behind."""
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    good = write_jsonl([{"text": "fine"}])
    with pytest.raises(ConfigError, match="no such file"):
        run_prepare("--input", good, "--input", tmp_path / "missing.jsonl", "--out", out)
    assert out.read_text() == "old\n"
    assert not (tmp_path / "out.jsonl.tmp").exists()


def test_limit_reads_at_most_n_rows_per_source(tmp_path, write_jsonl):
    """--limit caps each source."""
    a = write_jsonl([{"text": f"a{i}"} for i in range(5)], "a.jsonl")
    b = write_jsonl([{"text": f"b{i}"} for i in range(5)], "b.jsonl")
    run_prepare("--input", a, "--input", b, "--out", tmp_path / "out.jsonl", "--limit", "2")
    assert [r["messages"][0]["content"] for r in read_rows(tmp_path / "out.jsonl")] == [
        "a0",
        "a1",
        "b0",
        "b1",
    ]


ALPACA = [
    {"id": "a1", "instruction": "Add 2 and 2.", "input": "", "output": "4"},
    {"id": "a2", "instruction": "Translate.", "input": "bonjour", "output": "hello"},
    {"id": "a3", "instruction": "Add  2 and 2.", "input": "", "output": "four"},
]


def write_source(kind: str, tmp_path: Path) -> Path:
    """The ALPACA rows in one of the formats `datasets` reads."""
    import datasets

    ds = datasets.Dataset.from_list(ALPACA)
    path = tmp_path / f"src.{kind}"
    if kind == "parquet":
        ds.to_parquet(str(path))
    elif kind == "csv":
        ds.to_csv(str(path), index=False)
    elif kind == "json":
        path.write_bytes(orjson.dumps(ALPACA))  # one JSON array, not JSON lines
    elif kind == "disk":
        datasets.DatasetDict({"train": ds.select([0]), "test": ds}).save_to_disk(str(path))
    elif kind == "folder":
        path.mkdir()
        ds.to_json(str(path / "test.jsonl"))  # a split named by its file
    return path


@pytest.mark.parametrize("kind", ["parquet", "csv", "json", "disk", "folder"])
def test_dataset_sources_are_read_through_datasets(kind, tmp_path):
    """Parquet, CSV, a JSON array, a save_to_disk DatasetDict (--split) and a folder all work."""
    src = write_source(kind, tmp_path)
    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    assert run_prepare("--input", src, "--out", out, "--split", "test", "--report", report) == 0
    rows = read_rows(out)
    assert [r["messages"][0]["content"] for r in rows] == ["Add 2 and 2.", "Translate.\n\nbonjour"]
    assert [r["id"] for r in rows] == ["a1", "a2"]
    assert orjson.loads(report.read_bytes())["formats"] == {str(src): {"alpaca": 3}}


def test_cli_reports_config_errors_on_one_line(tmp_path, capsys):
    """Through the gen-pipeline CLI, a user error is one "error:" line and exit code 1."""
    code = cli.main(["prepare", "--input", str(tmp_path / "nope.parquet"), "--out", str(tmp_path / "o.jsonl")])
    assert code == 1
    assert "error: --input" in capsys.readouterr().err


def test_module_runs_alone_and_reports_an_unreachable_hub(tmp_path):
    """`python -m gen_pipeline prepare` runs alone; an unreachable hub name is a clean error."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    argv = ["--input", "someone/no-such-dataset", "--out", str(tmp_path / "o.jsonl")]
    result = subprocess.run(
        [sys.executable, "-m", "gen_pipeline", "prepare", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "error: cannot read someone/no-such-dataset" in result.stderr


CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
TOOL_TURNS = [
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "look it up"},
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"},
    {"role": "user", "content": "and tomorrow?"},
]
# Source rows on which prepare and generate disagreed (issue 29): a tool-call conversation prepare dropped
# ("bad_content"), and rows whose carried columns generate refuses, which prepare wrote.
DISPUTED = [
    ({"messages": TOOL_TURNS, "tools": [{"type": "function", "function": {"name": "get_weather"}}]}, None),
    ({"messages": TOOL_TURNS[:3], "tools": [{"type": "function", "function": {"name": "get_weather"}}]}, None),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, None),
    ({"prompt": "hi", "max_tokens": 0}, "bad_max_tokens"),
    ({"prompt": "hi", "sampling": "hot"}, "bad_sampling"),
    ({"prompt": "hi", "samples": 0}, "bad_samples"),
    ({"prompt": "hi", "tools": "get_weather"}, "bad_template_inputs"),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": "c1"},
                {"role": "user", "content": "y"},
            ]
        },
        "bad_tool_calls",
    ),
]


@pytest.mark.parametrize(("raw", "reason"), DISPUTED)
def test_prepare_writes_exactly_the_rows_generate_takes(raw, reason, tmp_path, write_jsonl):
    """One validator: every row prepare writes is one generate reads without a bad_input, and every row it
    refuses generate refuses too, for the same reason; a tool-call history is written whole."""
    out = tmp_path / "p.jsonl"
    report = prepare.prepare(prepare.PrepareConfig(inputs=(str(write_jsonl([raw])),), out=out))
    lines = out.read_bytes().splitlines()
    if reason is None:
        assert report.written == 1 and not report.invalid
        row = parse_row(lines[0], 1)  # generate's reader
        assert row.messages == raw["messages"] and row.tools == raw.get("tools")
    else:
        assert report.written == 0 and dict(report.invalid) == {reason: 1} and lines == []
        with pytest.raises(RowError) as info:
            parse_row(orjson.dumps({"id": "x", **raw}), 1)
        assert info.value.tag == reason


def test_a_tool_call_and_its_result_after_the_last_user_turn_stay_in_the_prompt():
    """The model's answer to a tool's result is asked with the call and the result: they are the prompt,
    and the answer after them is the reference (they were cut away, leaving the bare user turn)."""
    from gen_pipeline.inputs.formats import split_prompt

    final = {"role": "assistant", "content": "Sunny in Oslo."}
    assert split_prompt([*TOOL_TURNS[:3], final]) == (TOOL_TURNS[:3], "Sunny in Oslo.")
    assert split_prompt(TOOL_TURNS[:3]) == (TOOL_TURNS[:3], None)
    assert split_prompt([*TOOL_TURNS, final]) == (TOOL_TURNS, "Sunny in Oslo.")
