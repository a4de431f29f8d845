"""`export --format conversations|text`: the dataset in the shapes draft-model trainers read.

The contracts checked here are the trainers' documented ones, written out again in this file (never their
code): SpecForge (sgl-project/SpecForge) `docs/basic_usage/data_preparation.md` ("Conversation Format" and
"Pre-formatted Text Format"), the rules its `scripts/conversation_validation.py` and
`scripts/validate_regenerated_data.py` check, and the columns its reader `specforge/data/preprocessing.py`
(`build_eagle3_dataset`) takes; vllm-project/speculators `docs/cli/prepare_data.md` and its reader
`src/speculators/data_generation/preprocessing.py` (a `conversations` column loaded with
`load_dataset("json")`, each assistant turn's full render extending the generation-prompt render before it).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest
from conftest import QWEN3
from e2e import conversation_rows, prompts, read_jsonl, run_sim

from gen_pipeline.cli import export as cli_export
from gen_pipeline.records import Completion

needs_qwen3 = pytest.mark.skipif(not (QWEN3 / "tokenizer.json").exists(), reason="no Qwen3 tokenizer")
THINK = ("<think>", "</think>")


def run_export(*argv: Any) -> int:
    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    return cli_export.main(parser.parse_args([str(a) for a in argv]))


def specforge_problem(row: dict[str, Any]) -> str | None:
    """Why SpecForge's documented conversation contract refuses a row (None: it takes it).

    A non-empty string id; a non-empty list of messages with non-empty string content; system messages
    only before the first user turn; then user and assistant alternating from a user turn, ending with an
    assistant turn; reasoning_content a string or null; no <think> marker in an answer or its reasoning. The
    reader passes every column besides id, conversations and tools to the chat template, so there are none.
    """
    if set(row) - {"id", "conversations", "tools"}:
        return f"extra columns {sorted(set(row) - {'id', 'conversations', 'tools'})}"
    if not isinstance(row.get("id"), str) or not row["id"].strip():
        return "id"
    messages = row.get("conversations")
    if not isinstance(messages, list) or not messages:
        return "no messages"
    roles = [m.get("role") for m in messages]
    while roles and roles[0] == "system":
        roles = roles[1:]
    if not roles or roles != ["user", "assistant"] * (len(roles) // 2) or len(roles) % 2:
        return f"roles {roles}"
    for m in messages:
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            return f"empty content in {m}"
        if m["role"] == "assistant":
            reasoning = m.get("reasoning_content")
            if reasoning is not None and not isinstance(reasoning, str):
                return "reasoning_content"
            if any(t in (m["content"] + (reasoning or "")).lower() for t in THINK):
                return f"a thinking marker in {m}"
    return None


def _run(tmp_path: Path, rows: list[dict[str, Any]], name: str, sim: dict[str, Any], **run: Any) -> Path:
    inp = tmp_path / f"{name}.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    run_sim(inp, tmp_path / name, sim={"n_ports": 2, **sim}, **run)
    return tmp_path / name


def exported(out: Path) -> list[dict[str, Any]]:
    return read_jsonl(out / "train.jsonl")


def test_conversations_one_line_per_id_and_sample_in_specforges_shape(tmp_path):
    """--format conversations: {"id", "conversations"} lines, one per (id, sample), reasoning as
    reasoning_content on the assistant turn; SpecForge's contract holds and speculators' loader reads it."""
    run = _run(tmp_path, prompts(6), "run", {"reasoning_words": 4}, samples=2, max_tokens=64)
    lines = read_jsonl(run / "completions.jsonl")
    assert run_export(run, "--out", tmp_path / "conv", "--format", "conversations") == 0
    rows = exported(tmp_path / "conv")
    assert len(rows) == len(lines) == 12 and len({r["id"] for r in rows}) == 12
    by_id = {r["id"]: r for r in rows}
    for line in lines:
        row = by_id[str(line["id"]) if line["sample"] == 0 else f"{line['id']}#sample{line['sample']}"]
        assert specforge_problem(row) is None, (specforge_problem(row), row)
        *prompt, answer = row["conversations"]
        assert prompt == [{k: v for k, v in m.items() if v is not None} for m in line["messages"]]
        assert answer == {
            "role": "assistant",
            "content": line["completion"],
            "reasoning_content": line["reasoning_content"],
        }
    # speculators loads a file or a folder of JSON lines with load_dataset("json") and reads `conversations`
    ds = datasets.load_dataset(
        "json", data_files=str(tmp_path / "conv" / "train.jsonl"), split="train", cache_dir=str(tmp_path / "c")
    )
    assert ds.column_names == ["id", "conversations"] and len(ds) == 12
    assert (tmp_path / "conv" / "README.md").exists()


def test_conversations_of_a_turns_all_run_are_whole_with_each_turns_reasoning(tmp_path):
    """A --turns all run: one line per conversation, every assistant turn the target's own with its reasoning;
    --reasoning drop leaves none, inline puts it in the content as <think>...</think>."""
    run = _run(tmp_path, conversation_rows(4), "run", {"reasoning_words": 3}, turns="all", max_tokens=64)
    lines = {(r["id"], r["turn"]): r for r in read_jsonl(run / "completions.jsonl")}
    for mode in ("separate", "drop", "inline"):
        out = tmp_path / mode
        assert run_export(run, "--out", out, "--format", "conversations", "--reasoning", mode) == 0
        rows = exported(out)
        assert sorted(r["id"] for r in rows) == ["c0", "c1", "c2", "c3"]
        for row in rows:
            assert specforge_problem(row) is None or mode == "inline", specforge_problem(row)
            answers = [m for m in row["conversations"] if m["role"] == "assistant"]
            recorded = [lines[(row["id"], t)] for t in range(len(answers))]
            assert len(answers) == recorded[0]["turns"]
            for a, r in zip(answers, recorded, strict=True):
                if mode == "separate":
                    assert (a["content"], a["reasoning_content"]) == (r["completion"], r["reasoning_content"])
                elif mode == "drop":
                    assert a == {"role": "assistant", "content": r["completion"]}
                else:
                    assert a == {
                        "role": "assistant",
                        "content": f"<think>\n{r['reasoning_content']}\n</think>\n\n{r['completion']}",
                    }


def _line(i: int, completion: str, reasoning: str | None = None, finish: str = "stop") -> bytes:
    messages = [{"role": "user", "content": f"Q{i}"}]
    c = Completion(i, messages, completion, finish, 9, 9, 3, 64, "s0", 1, 0.2, "sim-model", {})
    obj = orjson.loads(c.to_line())
    if reasoning is not None:
        obj["reasoning_content"] = reasoning
    return orjson.dumps(obj) + b"\n"


@pytest.mark.parametrize("mode", ["separate", "drop"])
def test_no_raw_think_marker_is_left_in_an_answer(tmp_path, mode):
    """Answers from a server without a reasoning parser hold <think>...</think> in their text: `separate`
    moves it to reasoning_content, `drop` leaves it out; no marker is left either way."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [
        _line(0, "<think>\nstep one\n</think>\n\nThe answer."),
        _line(1, "Plain answer.", reasoning="parsed thinking"),
        _line(2, "<think>cut while thinking", finish="length"),  # never closed: all of it is thinking
    ]
    (run / "completions.jsonl").write_bytes(b"".join(lines))
    (run / "manifest.json").write_bytes(orjson.dumps({"model": "sim-model"}))
    out = tmp_path / "conv"
    assert run_export(run, "--out", out, "--format", "conversations", "--reasoning", mode) == 0
    answers = {r["id"]: r["conversations"][-1] for r in exported(out)}
    assert not any(t in orjson.dumps(answers).decode() for t in THINK)
    if mode == "separate":
        assert answers["0"] == {"role": "assistant", "content": "The answer.", "reasoning_content": "step one"}
        assert answers["1"] == {"role": "assistant", "content": "Plain answer.", "reasoning_content": "parsed thinking"}
        assert answers["2"] == {"role": "assistant", "content": "", "reasoning_content": "cut while thinking"}
    else:
        assert [answers[k] for k in "012"] == [
            {"role": "assistant", "content": c} for c in ("The answer.", "Plain answer.", "")
        ]
    assert run_export(run, "--out", tmp_path / "kept", "--format", "conversations", "--drop-truncated") == 0
    assert sorted(r["id"] for r in exported(tmp_path / "kept")) == ["0", "1"]


@needs_qwen3
def test_text_is_the_conversation_rendered_as_the_target_serves_it(tmp_path):
    """--format text: {"id", "text"}, the whole conversation rendered with the run's tokenizer and template;
    it begins with exactly the prompt the target was sent (as many tokens as the server counted), and is what
    transformers' apply_chat_template renders for the conversation with its answer (SpecForge's preformatted
    rows; speculators' render boundary)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN3))
    sim = {"reasoning_words": 4, "tokenizer": str(QWEN3)}
    run = _run(tmp_path, conversation_rows(3), "run", sim, turns="all", max_tokens=48)
    lines = read_jsonl(run / "completions.jsonl")
    assert run_export(run, "--out", tmp_path / "text", "--format", "text") == 0
    rows = {r["id"]: r for r in exported(tmp_path / "text")}
    assert sorted(rows) == ["c0", "c1", "c2"] and all(set(r) == {"id", "text"} for r in rows.values())
    for rid, row in rows.items():
        last = max((x for x in lines if x["id"] == rid), key=lambda x: x["turn"])
        answer = {"role": "assistant", "content": last["completion"], "reasoning_content": last["reasoning_content"]}
        whole = tok.apply_chat_template([*last["messages"], answer], tokenize=False, add_generation_prompt=False)
        prompt = tok.apply_chat_template(last["messages"], tokenize=False, add_generation_prompt=True)
        assert row["text"] == whole and row["text"].startswith(prompt)
        assert len(tok(prompt, add_special_tokens=False)["input_ids"]) == last["prompt_tokens"]
        assert f"<think>\n{last['reasoning_content']}\n</think>\n\n{last['completion']}<|im_end|>" in row["text"]
    # --row-per-turn: every turn's own request and answer, as the target was sent and answered it
    assert run_export(run, "--out", tmp_path / "turns", "--format", "text", "--row-per-turn") == 0
    turns = {r["id"]: r["text"] for r in exported(tmp_path / "turns")}
    assert len(turns) == len(lines)
    for line in lines:
        answer = {"role": "assistant", "content": line["completion"], "reasoning_content": line["reasoning_content"]}
        whole = tok.apply_chat_template([*line["messages"], answer], tokenize=False, add_generation_prompt=False)
        assert turns[f"{line['id']}#turn{line['turn']}"] == whole


@needs_qwen3
def test_inline_reasoning_is_written_as_the_targets_template_shows_it(tmp_path):
    """--reasoning inline: the answer's content is what the run's template renders for an assistant turn
    with that reasoning (Qwen3: <think>\\n...\\n</think>\\n\\n before the answer)."""
    sim = {"reasoning_words": 4, "tokenizer": str(QWEN3)}
    run = _run(tmp_path, prompts(3), "run", sim, max_tokens=48)
    lines = {str(x["id"]): x for x in read_jsonl(run / "completions.jsonl")}
    assert run_export(run, "--out", tmp_path / "conv", "--format", "conversations", "--reasoning", "inline") == 0
    for row in exported(tmp_path / "conv"):
        line = lines[row["id"]]
        assert row["conversations"][-1] == {
            "role": "assistant",
            "content": f"<think>\n{line['reasoning_content']}\n</think>\n\n{line['completion']}",
        }


def test_every_input_row_is_exported_ledgered_or_counted_as_left_out(tmp_path, capsys):
    """SpecForge's recipe checks success + error + skipped == input: here every input row is a line of the
    export, an entry of the ledger, or in the card's and the printed counts of what was left out."""
    rows = [*prompts(8), {"id": "huge", "messages": [{"role": "user", "content": "word " * 3000}]}]
    run = _run(tmp_path, rows, "run", {"context_length": 600}, max_tokens=24, min_tokens=1)
    out = tmp_path / "conv"
    assert run_export(run, "--out", out, "--format", "conversations", "--drop-truncated") == 0
    printed = capsys.readouterr().out
    written = {r["id"] for r in exported(out)}
    ledgered = {str(x["id"]) for x in read_jsonl(run / "failures.jsonl")}
    truncated = {str(x["id"]) for x in read_jsonl(run / "completions.jsonl") if x["finish_reason"] == "length"}
    assert written | ledgered | truncated == {str(r["id"]) for r in rows}
    assert not (written & ledgered) and not (written & truncated) and ledgered == {"huge"}
    card = (out / "README.md").read_text()
    assert (
        f"| rows | {len(written)} |" in card
        and f"| left out: truncated (finish_reason length) | {len(truncated)} |" in card
    )
    assert "| not generated: over_length (ledger) | 1 |" in card
    assert f"export: {len(written)} rows from {len(written)} completion lines -> {out}" in printed
    assert Counter(type(r["id"]) for r in exported(out)) == {str: len(written)}


def expanded(row: dict[str, Any]) -> list[dict[str, Any]]:
    """SpecForge's documented expansion of a conversation (data_preparation.md, "Multi-turn structured
    reasoning"): one row per assistant turn, ending at it with its reasoning, the history's answers keeping
    only their visible content."""
    rows, history = [], []
    for m in row["conversations"]:
        if m["role"] == "assistant":
            rows.append({"id": f"{row['id']}#turn{len(rows)}", "conversations": [*history, m]})
            m = {k: v for k, v in m.items() if k != "reasoning_content"}
        history.append(m)
    return rows


def test_a_row_per_turn_is_specforges_expansion_of_the_conversations(tmp_path, capsys):
    """--row-per-turn: one line per assistant turn, each the expansion SpecForge's expand script documents of
    the conversation line (its history without reasoning); the counts say rows of turns."""
    run = _run(tmp_path, conversation_rows(3), "run", {"reasoning_words": 3}, turns="all", max_tokens=64)
    turns = len(read_jsonl(run / "completions.jsonl"))
    assert run_export(run, "--out", tmp_path / "conv", "--format", "conversations") == 0
    assert run_export(run, "--out", tmp_path / "turns", "--format", "conversations", "--row-per-turn") == 0
    printed = capsys.readouterr().out
    want = [e for row in exported(tmp_path / "conv") for e in expanded(row)]
    got = exported(tmp_path / "turns")
    assert len(got) == turns and sorted(got, key=lambda r: r["id"]) == sorted(want, key=lambda r: r["id"])
    assert all(specforge_problem(r) is None for r in got)
    assert f"export: {turns} rows from {turns} completion lines" in printed
    assert "export: 3 conversations (3 complete, 0 ended early) of 3" in printed
    with pytest.raises(Exception, match="--row-per-turn"):
        run_export(run, "--out", tmp_path / "ds", "--row-per-turn")


def test_text_finds_the_runs_tokenizer_or_is_told_where_it_is(tmp_path):
    """--format text loads the tokenizer the manifest names; moved away, the error says --tokenizer, which
    takes a copy; a tokenizer with another chat template is refused, naming the run's."""
    import shutil

    from gen_pipeline.errors import ConfigError
    from gen_pipeline.tokens import TINY_TOKENIZER

    shutil.copytree(TINY_TOKENIZER, tmp_path / "tok")
    run = _run(tmp_path, prompts(3), "run", {"tokenizer": str(tmp_path / "tok")}, max_tokens=16)
    shutil.move(tmp_path / "tok", tmp_path / "moved")
    with pytest.raises(ConfigError, match="--tokenizer"):
        run_export(run, "--out", tmp_path / "a", "--format", "text")
    assert run_export(run, "--out", tmp_path / "b", "--format", "text", "--tokenizer", tmp_path / "moved") == 0
    assert len(exported(tmp_path / "b")) == 3
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "moved", other)
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ConfigError, match="not the one the run used"):
        run_export(run, "--out", tmp_path / "c", "--format", "text", "--tokenizer", other)
