"""OpenAI Batch files: request lines are accepted as they are, and `export --format openai-batch` writes the
API's output and error files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from e2e import read_jsonl, run_sim

from gen_pipeline.cli import main
from gen_pipeline.export.batchexport import write_batch
from gen_pipeline.inputs.rows import RowError, parse_row


def batch_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": messages, **body},
    }


def test_a_batch_line_is_the_row_it_asks_for() -> None:
    """custom_id is the id; max_tokens (or max_completion_tokens) and the sampling fields are the row's own."""
    raw = orjson.dumps(batch_line("req-1", "hi", max_completion_tokens=7, temperature=0.2, top_p=0.9, n=2))
    prompt = parse_row(raw, 0)
    assert prompt.id == "req-1" and prompt.max_tokens == 7 and prompt.samples == 2
    assert prompt.sampling == {"temperature": 0.2, "top_p": 0.9}
    assert prompt.messages[1] == {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({**batch_line("a", "x"), "method": "GET"}, "must be POST /v1/chat/completions"),
        ({**batch_line("a", "x"), "url": "/v1/embeddings"}, "must be POST /v1/chat/completions"),
        ({**batch_line("a", "x"), "extra": 1}, "custom_id, method, url and body only"),
        (batch_line("", "x"), "custom_id must be a non-empty string"),
        (batch_line("a", "x", stream=True), "may not ask to stream"),
        (batch_line("a", "x", max_tokens=5, max_completion_tokens=6), "differ"),
        ({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": []}, "body must be an object"),
        ({**batch_line("a", "x"), "messages": []}, "custom_id, method, url and body only"),
        ({k: v for k, v in batch_line("a", "x").items() if k != "method"}, r"needs custom_id, method, url and body"),
        ({k: v for k, v in batch_line("a", "x").items() if k != "url"}, r"needs custom_id, method, url and body"),
    ],
)
def test_a_batch_line_that_is_not_a_chat_request_is_bad_input(line: dict[str, Any], error: str) -> None:
    """Anything but a chat completion request is refused with the reason."""
    with pytest.raises(RowError, match=error):
        parse_row(orjson.dumps(line), 0)


def test_a_row_of_ours_with_a_custom_id_field_keeps_it_in_meta() -> None:
    """Only a line with custom_id and body is a Batch line; a custom_id beside messages is carried as before."""
    prompt = parse_row(orjson.dumps({"id": 7, "prompt": "hi", "custom_id": "x-1"}), 0)
    assert prompt.id == 7 and prompt.meta == {"custom_id": "x-1"}


def test_a_batch_file_runs_through_generate_and_comes_back_in_the_batch_format(tmp_path: Path, capsys) -> None:
    """generate takes the Batch file as it is; export --format openai-batch gives output and error files."""
    lines = [
        batch_line(f"req-{i}", f"question {i} " + "more " * i, max_tokens=8 + i, temperature=0.5) for i in range(6)
    ]
    lines.append(batch_line("req-n", "two answers", max_tokens=12, n=2))
    bad = {**batch_line("req-bad", "x"), "url": "/v1/embeddings"}
    inp = tmp_path / "batch.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*lines, bad]))
    out = tmp_path / "run"
    outcome, _ = run_sim(inp, out, {"n_ports": 2})
    assert outcome.summary["completed"] == 8 and outcome.summary["failed"] == {"bad_input": 1}
    sent = {r["id"]: r["max_tokens"] for r in read_jsonl(out / "completions.jsonl")}
    assert sent["req-3"] == 11  # the body's max_tokens is the row's budget
    assert main(["export", str(out), "--out", str(tmp_path / "batch-out"), "--format", "openai-batch"]) == 0
    said = capsys.readouterr().out  # one line per prompt (req-n's two samples are one)
    assert said.startswith(f"export: 7 output lines from 8 completion lines -> {tmp_path / 'batch-out'}"), said
    results = {r["custom_id"]: r for r in read_jsonl(tmp_path / "batch-out" / "output.jsonl")}
    assert set(results) == {f"req-{i}" for i in range(6)} | {"req-n"}
    completions = {(r["id"], r["sample"]): r for r in read_jsonl(out / "completions.jsonl")}
    for custom_id, result in results.items():
        assert result["id"].startswith("batch_req_") and result["error"] is None
        response = result["response"]
        assert response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == "sim-model"
        for choice in body["choices"]:
            line = completions[(custom_id, choice["index"])]
            assert choice["message"] == {"role": "assistant", "content": line["completion"]}
            assert choice["finish_reason"] == line["finish_reason"]
        usage = body["usage"]
        if custom_id == "req-n":  # the server counts n choices together: no line has them, none is made up
            assert usage["completion_tokens"] is usage["total_tokens"] is None and usage["prompt_tokens"] > 0
        else:
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert [c["index"] for c in results["req-n"]["response"]["body"]["choices"]] == [0, 1]
    errors = read_jsonl(tmp_path / "batch-out" / "errors.jsonl")
    assert len(errors) == 1
    assert errors[0]["custom_id"] == "req-bad" and errors[0]["response"] is None
    assert errors[0]["error"]["code"] == "bad_input" and "POST /v1/chat/completions" in errors[0]["error"]["message"]


def test_dataset_flags_are_refused_with_the_batch_format(tmp_path: Path, capsys) -> None:
    """--group-samples and the like shape a dataset: refused with --format openai-batch."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "completions.jsonl").write_text("")
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--format", "openai-batch", "--group-samples"]) == 1
    assert "--group-samples shape a dataset" in capsys.readouterr().err


def test_a_prompts_samples_written_apart_are_one_output_line(tmp_path: Path) -> None:
    """A sample retried in a later run (or sent on its own) is written after other prompts' lines: it still
    joins its prompt's line, so each custom_id has one output line with its choices in sample order."""

    def line(row_id: str, sample: int, text: str) -> dict[str, Any]:
        return {"id": row_id, "sample": sample, "completion": text, "finish_reason": "stop", "model": "m"}

    lines = [line("a", 1, "a1"), line("b", 0, "b0"), line("a", 0, "a0"), line("b", 1, "b1")]
    write_batch(SimpleNamespace(runs=()), tmp_path / "out", iter(lines))  # type: ignore[arg-type]
    written = [orjson.loads(x) for x in (tmp_path / "out" / "output.jsonl").read_bytes().splitlines()]
    assert [w["custom_id"] for w in written] == ["a", "b"]
    choices = [[(c["index"], c["message"]["content"]) for c in w["response"]["body"]["choices"]] for w in written]
    assert choices == [[(0, "a0"), (1, "a1")], [(0, "b0"), (1, "b1")]]


def test_an_answers_tool_calls_are_in_its_choice(tmp_path: Path) -> None:
    """A chat.completion's message carries the answer's tool calls (they were dropped); an answer of calls
    alone has null content, one with text keeps it."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

    def line(row_id: str, text: str, **more: Any) -> dict[str, Any]:
        return {"id": row_id, "sample": 0, "completion": text, "finish_reason": "tool_calls", "model": "m", **more}

    lines = [line("calls", "", tool_calls=[call]), line("both", "let me look", tool_calls=[call]), line("text", "hi")]
    write_batch(SimpleNamespace(runs=()), tmp_path / "out", iter(lines))  # type: ignore[arg-type]
    written = [orjson.loads(x) for x in (tmp_path / "out" / "output.jsonl").read_bytes().splitlines()]
    messages = {w["custom_id"]: w["response"]["body"]["choices"][0]["message"] for w in written}
    assert messages["calls"] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert messages["both"] == {"role": "assistant", "content": "let me look", "tool_calls": [call]}
    assert messages["text"] == {"role": "assistant", "content": "hi"}


def test_a_turns_all_run_is_refused_with_the_batch_format(tmp_path: Path, capsys) -> None:
    """A --turns all run answered every turn of its conversations, one Batch request answers one: refused
    (it wrote the turns as choices of one line, every one index 0)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "completions.jsonl").write_text("")
    (run / "manifest.json").write_text(orjson.dumps({"turns": "all"}).decode())
    assert main(["export", str(run), "--out", str(tmp_path / "o"), "--format", "openai-batch"]) == 1
    assert "a --turns all run answered every turn" in capsys.readouterr().err
