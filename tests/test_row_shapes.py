"""Rows as they come (issue 53): `--template` over a row's columns, and conversations as they are (trailing
assistant turns kept aside as `reference`, consecutive user turns merged), end to end on the simulator."""

from __future__ import annotations

import orjson
import pytest
from e2e import read_jsonl, run_sim

from gen_pipeline.cli import main as cli_main
from gen_pipeline.config import RunConfig
from gen_pipeline.errors import ConfigError, ManifestMismatchError
from gen_pipeline.inputs.rows import RowError, parse_row
from gen_pipeline.inputs.shape import RowShape, merge_user_turns, trailing_answer
from gen_pipeline.options import build_config
from gen_pipeline.preflight.check import template_example, template_lines
from gen_pipeline.progress.stats import format_summary

TEMPLATE = "Answer briefly.\n\nQuestion: {{ question }}{% if context %}\nContext: {{ context }}{% endif %}\n"


def _rows() -> list[dict]:
    return [
        {"id": "a", "question": "why is the sky blue", "context": "physics", "source": "x"},
        {"id": "b", "question": "what is 2 + 2", "context": ""},
        {"id": "c", "context": "no question here"},  # the template reads a column this row lacks
        {"id": "d", "question": None, "context": "a null question"},
        {"question": "an id-less row", "context": None},
    ]


def test_template_renders_the_user_message_that_is_counted_sent_and_recorded(write_jsonl, tmp_path):
    """--template: each row's columns render its user message under --system-prompt; the rendered prompt is the
    line's messages and was counted exactly as the server counted it; other columns stay in meta."""
    path, out = write_jsonl(_rows()), tmp_path / "out"
    outcome, _ = run_sim(path, out, template=TEMPLATE, system_prompt="be brief")
    done = {r["id"]: r for r in read_jsonl(out / "completions.jsonl")}
    assert done["a"]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Answer briefly.\n\nQuestion: why is the sky blue\nContext: physics"},
    ]
    assert done["b"]["messages"][1]["content"] == "Answer briefly.\n\nQuestion: what is 2 + 2"
    assert all(r["prompt_tokens"] == r["input_tokens"] for r in done.values())
    assert done["a"]["meta"] == {"question": "why is the sky blue", "context": "physics", "source": "x"}
    idless = next(r for r in done.values() if r["meta"].get("question") == "an id-less row")
    assert str(idless["id"]).startswith("h")  # a content id, of the rendered prompt
    ledger = {r["id"]: r for r in read_jsonl(out / "failures.jsonl")}
    assert ledger["c"]["reason"] == "bad_input" and "column 'question'" in ledger["c"]["detail"]
    assert ledger["d"]["reason"] == "bad_input" and "null" in ledger["d"]["detail"]
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 3


def test_template_sandbox_refuses_unsafe_access_per_row(write_jsonl, tmp_path):
    """A template that reaches outside the row's values fails on the row (bad_input), not the run."""
    path, out = write_jsonl([{"id": 1, "q": "hi"}]), tmp_path / "out"
    outcome, _ = run_sim(path, out, template="{{ q.__class__.__mro__ }}")
    [entry] = read_jsonl(out / "failures.jsonl")
    assert entry["reason"] == "bad_input" and "SecurityError" in entry["detail"]
    assert outcome.summary["completed"] == 0


def test_template_that_does_not_parse_is_refused_before_the_run(tmp_path, capsys):
    """A broken template stops generate at once (exit 1) naming the file and line; nothing is made."""
    bad = tmp_path / "t.j2"
    bad.write_text("line one\n{{ question \n")
    with pytest.raises(ConfigError, match=r"t\.j2 line 2"):
        build_config(tmp_path / "in.jsonl", tmp_path / "out", template=bad)
    code = cli_main(["generate", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out"), "--template", str(bad)])
    assert code == 1 and "does not parse" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_resume_with_another_template_is_refused(write_jsonl, tmp_path):
    """The manifest keeps the template's hash: another template is another prompt for every row."""
    path, out = write_jsonl(_rows()[:2]), tmp_path / "out"
    run_sim(path, out, template=TEMPLATE)
    with pytest.raises(ManifestMismatchError, match="template_sha256"):
        run_sim(path, out, template="{{ question }}")
    again, _ = run_sim(path, out, template=TEMPLATE)
    assert again.summary["skipped"] == {"done": 2}


def test_check_shows_one_rendered_example(write_jsonl, tmp_path):
    """check's report holds the first row the template renders, as it is sent."""
    rows = _rows()
    path = write_jsonl([rows[2], rows[3], rows[0]])
    config = RunConfig(input=path, out=tmp_path / "out", template=TEMPLATE, system_prompt="sys")
    example = template_example(config)
    assert example["id"] == "a"  # c and d do not render
    lines = template_lines({"template": example})
    assert lines[0] == "template: line 3 (id 'a') is sent as:"
    assert "  [system] sys" in lines and "  [user] Question: why is the sky blue" in lines
    bad = RunConfig(input=write_jsonl(_rows()[2:3], "bad.jsonl"), out=tmp_path / "o", template=TEMPLATE)
    nothing = template_example(bad)
    assert "column 'question'" in nothing["error"]


# conversations as they are


CHAT_LOG = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "second question"},
    {"role": "assistant", "content": "OLD final answer"},
]


def test_a_row_ending_with_an_answer_is_answered_from_its_last_user_turn(write_jsonl, tmp_path):
    """--turns last: the trailing assistant turn is not sent; the line keeps it as `reference`; the summary
    counts such rows. Rows that end with a user turn are sent as they are."""
    rows = [{"id": "log", "messages": CHAT_LOG}, {"id": "plain", "messages": CHAT_LOG[:4]}]
    path, out = write_jsonl(rows), tmp_path / "out"
    outcome, _ = run_sim(path, out)
    done = {r["id"]: r for r in read_jsonl(out / "completions.jsonl")}
    assert done["log"]["messages"] == CHAT_LOG[:4] and done["log"]["reference"] == "OLD final answer"
    assert done["log"]["prompt_tokens"] == done["log"]["input_tokens"]
    assert done["plain"]["messages"] == CHAT_LOG[:4] and "reference" not in done["plain"]
    assert outcome.summary["reshaped"] == {"answered_from_last_user_turn": 1}
    assert "1 row(s) ended with assistant turns: answered from their last user turn" in format_summary(outcome.summary)


def test_consecutive_user_turns_are_one_turn_under_both_turn_modes(write_jsonl, tmp_path):
    """[user a, user b, assistant c]: one user turn "a\\n\\nb"; --turns all answers it once, inventing nothing."""
    messages = [
        {"role": "user", "content": "part one"},
        {"role": "user", "content": [{"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "old"},
    ]
    merged = [{"role": "user", "content": "part one\n\npart two"}]
    path = write_jsonl([{"id": 1, "messages": messages}])
    last, _ = run_sim(path, tmp_path / "last")
    [line] = read_jsonl(tmp_path / "last" / "completions.jsonl")
    assert line["messages"] == merged and line["reference"] == "old"
    assert last.summary["reshaped"] == {"answered_from_last_user_turn": 1, "user_turns_merged": 1}
    everything, _ = run_sim(path, tmp_path / "all", turns="all")
    lines = read_jsonl(tmp_path / "all" / "completions.jsonl")
    assert [(r["turn"], r["messages"]) for r in lines] == [(0, merged)]
    assert everything.summary["conversations"]["complete"] == 1


def test_a_row_keeps_its_content_id_when_shaped():
    """An id-less row's id is the content id of its messages as written: shaping never moves it."""
    raw = orjson.dumps({"messages": CHAT_LOG})
    assert parse_row(raw, 1, RowShape()).id == parse_row(raw, 1).id
    assert parse_row(raw, 1, RowShape()).messages == CHAT_LOG[:4]
    assert parse_row(raw, 1).messages == CHAT_LOG  # prepare's check reads rows as written


@pytest.mark.parametrize(
    ("messages", "kept", "dropped"),
    [
        (CHAT_LOG, 4, 1),
        (CHAT_LOG[:4], 4, 0),
        (
            [
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": "b"},
            ],
            1,
            2,
        ),
        ([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], 2, 0),  # no user turn: as is
        (
            [{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}],
            2,
            1,
        ),
    ],
)
def test_trailing_answer_table(messages, kept, dropped):
    """What --turns last sends of a conversation: up to its last user turn or tool result."""
    sent, n, _ = trailing_answer(messages)
    assert (len(sent), n) == (kept, dropped)


def test_merge_keeps_other_turns_apart():
    """Only user turns next to each other merge."""
    m = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "b"}]
    assert merge_user_turns(m) == (m, 0)
    three = [{"role": "user", "content": t} for t in "abc"]
    assert merge_user_turns(three) == ([{"role": "user", "content": "a\n\nb\n\nc"}], 2)


def test_template_row_error_is_a_row_error():
    """A row the template cannot render is a RowError tagged `template` (prepare's report counts tags)."""
    with pytest.raises(RowError, match="column 'q'") as info:
        parse_row(b'{"id": 1}', 1, RowShape.of("{{ q }}"))
    assert info.value.tag == "template"
