"""Input validation: every bad row kind becomes a BadRow; repeats collapse; ids are stable."""

from __future__ import annotations

import pytest

from gen_pipeline.inputs.rows import BadRow
from gen_pipeline.inputs.source import PromptSource
from gen_pipeline.records import content_id

GOOD = {"id": "a", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        (b"{not json", "invalid JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"id": "x"}', "neither messages nor prompt"),
        (b'{"id": "x", "messages": []}', "non-empty list"),
        (b'{"id": "x", "messages": [{"role": "user", "content": ""}]}', "content is empty"),
        (b'{"id": "x", "messages": [{"role": "user", "content": 5}]}', "must be a string"),
        (b'{"id": "x", "messages": [{"role": "wizard", "content": "hi"}]}', "unknown role"),
        (b'{"id": "x", "messages": ["hi"]}', "not an object"),
        (b'{"id": "x", "prompt": "   "}', "non-empty string"),
        (b'{"id": "x", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "both"),
        (b'{"id": true, "prompt": "a"}', "id must be"),
        (b'{"id": "x", "prompt": "a", "max_tokens": 0}', "max_tokens"),
        (b'{"id": "x", "prompt": "a", "sampling": {"max_tokens": 3}}', "sampling may not set"),
        (b'{"id": "x", "prompt": "caf\xe9"}', "invalid UTF-8"),
        (b'{"id": "x", "prompt": "a", "id": "y"}', 'the key "id" more than once'),
        (b'{"id": "x", "prompt": "a", "id": "x"}', 'the key "id" more than once'),
        (b'{"prompt": "a", "id": "x", "id": "y"}', 'the key "id" more than once'),
        (b'{"id": "x", "messages": [{"role": "user", "content": "a"}], "messages": []}', '"messages" more than once'),
        (b'{"id": "x", "prompt": "a", "max_tokens": 5, "max_tokens": 9}', 'the key "max_tokens" more than once'),
        (b'{"id": 123456789012345678901234567890, "prompt": "a"}', "integer, not 123456789012345678901234567890"),
        (b'{"id": "x", "prompt": "a", "max_tokens": 1000000000000000000000000000000}', "not 1" + "0" * 30),
        (b'{"id": "x", "prompt": "a", "samples": -99999999999999999999}', "not -99999999999999999999"),
    ],
)
def test_each_bad_row_kind(write_jsonl, line, detail):
    """A bad row yields a BadRow with its line number and a one-line reason."""
    path = write_jsonl([GOOD, line])
    items = list(PromptSource(path))
    assert items[0].id == "a"
    bad = items[1]
    assert isinstance(bad, BadRow) and bad.line == 2 and detail in bad.detail
    assert "\n" not in bad.detail


def test_prompt_field_meta_and_options(write_jsonl):
    """A prompt string becomes one user message; unknown fields go to meta."""
    row = {"id": 7, "prompt": "hello", "max_tokens": 12, "sampling": {"temperature": 0}, "src": "x"}
    [p] = list(PromptSource(write_jsonl([row])))
    assert p.id == 7 and p.messages == [{"role": "user", "content": "hello"}]
    assert p.max_tokens == 12 and p.sampling == {"temperature": 0} and p.meta == {"src": "x"}


def test_missing_id_is_a_stable_content_hash(write_jsonl):
    """A row without an id gets the same id in every run, equal for whitespace variants."""
    msgs = [{"role": "user", "content": "What  is\tlife?"}]
    [p] = list(PromptSource(write_jsonl([{"messages": msgs}])))
    assert p.id == content_id(msgs)
    assert p.id == content_id([{"role": "user", "content": " What is life? "}])
    assert p.id != content_id([{"role": "system", "content": "What is life?"}])


def test_repeat_once_conflict_is_bad(write_jsonl):
    """The same id with the same content is processed once; with other content it is bad."""
    other = {"id": "a", "messages": [{"role": "user", "content": "different"}]}
    source = PromptSource(write_jsonl([GOOD, GOOD, other, b"", {"prompt": "p"}, {"prompt": "p"}]))
    items = list(source)
    assert [type(i).__name__ for i in items] == ["Prompt", "BadRow", "Prompt"]
    assert "seen before with different content" in items[1].detail and items[1].line == 3
    assert items[1].id is None  # not that id's row: its ledger entry must not stand for the id
    assert source.repeats == 2


def test_integer_and_string_ids_are_one_id(write_jsonl):
    """Id 1 and id "1" are the same id."""
    rows = [{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}]
    items = list(PromptSource(write_jsonl(rows)))
    assert isinstance(items[1], BadRow)


def test_an_id_written_as_integer_then_as_string_with_the_same_content_is_a_repeat(write_jsonl):
    """`42` then `"42"` (one id) with otherwise the same row is a repeat, processed once; with other
    content it is bad, and the message shows the id as that row wrote it."""
    rows = [{"id": 42, "prompt": "a", "x": 1}, {"x": 1, "prompt": "a", "id": "42"}, {"id": "42", "prompt": "b"}]
    source = PromptSource(write_jsonl(rows))
    items = list(source)
    assert [type(i).__name__ for i in items] == ["Prompt", "BadRow"]
    assert source.repeats == 1 and items[1].detail == "id '42' was seen before with different content"


def test_repeats_without_id_collapse_even_when_whitespace_differs(write_jsonl):
    """Id-less rows whose normalized text is equal are one prompt; an explicit id compares exact text."""
    rows = [
        {"prompt": "What is  life?"},
        {"prompt": " What is life? "},
        {"id": "x", "prompt": "a b"},
        {"id": "x", "prompt": "a  b"},
    ]
    source = PromptSource(write_jsonl(rows))
    items = list(source)
    assert [type(i).__name__ for i in items] == ["Prompt", "Prompt", "BadRow"]
    assert source.repeats == 1 and items[2].line == 4


def test_rows_without_id_with_the_same_messages_and_other_settings_are_bad_not_dropped(write_jsonl):
    """Id-less rows are known by their normalized messages: the same messages asked again with another
    max_tokens, sampling, samples count or meta is not the same row (it was dropped as a repeat, its samples
    never made and nothing said): it is bad_input, saying to give it an id. The same settings is a repeat."""
    rows = [
        {"prompt": "same text", "max_tokens": 10},
        {"prompt": "same  text", "max_tokens": 10},
        {"messages": [{"role": "user", "content": "same text"}], "max_tokens": 10},
        {"prompt": "same text", "max_tokens": 40},
        {"prompt": "same text", "max_tokens": 10, "sampling": {"temperature": 1.5}, "samples": 3},
        {"prompt": "same text", "max_tokens": 10, "source": "second"},
    ]
    source = PromptSource(write_jsonl(rows))
    items = list(source)
    assert [type(i).__name__ for i in items] == ["Prompt", "BadRow", "BadRow", "BadRow"]
    assert source.repeats == 2
    assert [i.line for i in items[1:]] == [4, 5, 6]
    assert all("give each such row its own id" in i.detail and i.id is None for i in items[1:])


def test_batch_lines_with_one_custom_id_and_other_bodies_are_bad_not_dropped(write_jsonl):
    """An OpenAI Batch line's id is its custom_id: a second line with it and another body is bad_input (it
    was dropped as a repeat, the line in neither file); the very same line again is a repeat."""

    def batch(content: str, **body: object) -> dict[str, object]:
        messages = [{"role": "user", "content": content}]
        request = {"model": "m", "messages": messages, **body}
        return {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": request}

    rows = [batch("first"), batch("first"), batch("second, different"), batch("first", temperature=0.5)]
    source = PromptSource(write_jsonl(rows))
    items = list(source)
    assert [type(i).__name__ for i in items] == ["Prompt", "BadRow", "BadRow"]
    assert source.repeats == 1 and [i.line for i in items[1:]] == [3, 4]
    assert items[1].detail == "id 'r1' was seen before with different content"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"id": "abc", "prompt": "x"}', "abc"),
        (b'{"id":12,"prompt":"x"}', 12),
        (b'{"id": -3, "prompt": "x"}', -3),
        (b'{"id": "caf\xc3\xa9", "prompt": "x"}', "caf\u00e9"),
        (b'{"id": "a\\"b", "prompt": "x"}', None),  # escapes: leave it to the real parser
        (b'{"id": 012, "prompt": "x"}', None),  # not JSON
        (b'{"prompt": "x", "id": 1}', None),  # id not first
        (b'{"id": "last"}', None),  # nothing after the id: let the parser judge the row
        (b'{"id": 18446744073709551615, "prompt": "x"}', 2**64 - 1),  # the largest integer JSON gives back
        (b'{"id": 18446744073709551616, "prompt": "x"}', None),  # parsed as a float: let the parser judge it
        (b'{"id": -9223372036854775809, "prompt": "x"}', None),
    ],
)
def test_peek_id(raw, expected):
    """The id is read off the line start only when that is unambiguous."""
    from gen_pipeline.records import peek_id

    assert peek_id(raw) == expected


def test_settled_rows_are_skipped_without_parsing(write_jsonl):
    """Rows the resume state names are skipped by their leading id; the rest are parsed as usual."""
    from gen_pipeline.inputs.source import Skipped
    from gen_pipeline.records import id_key

    done = {id_key("a"), id_key(2)}
    rows = [{"id": "a", "prompt": "x"}, {"id": 2, "prompt": "y"}, {"id": "c", "prompt": "z"}, {"prompt": "w"}]
    items = list(PromptSource(write_jsonl(rows), lambda key: "done" if key in done else None))
    assert [type(i).__name__ for i in items] == ["Skipped", "Skipped", "Prompt", "Prompt"]
    assert items[0] == Skipped("done")


@pytest.mark.parametrize("settled", [(), ("a",), ("a", "b")])
def test_repeat_or_conflict_does_not_depend_on_the_resume_state(write_jsonl, settled):
    """The first row with an id owns it, valid or not; a later row is a repeat when it is the same JSON
    object, whether or not the owner was settled (and so skipped unparsed) by an earlier run."""
    from gen_pipeline.records import id_key

    rows = [
        {"id": "a", "prompt": "x", "tag": 1},
        b'{"id": "b", "prompt": }',  # broken, but its id can be read: it owns "b"
        {"id": "b", "prompt": "valid"},  # a conflict with the broken owner
        {"tag": 1, "prompt": "x", "id": "a"},  # the same object: a repeat
        {"id": "a", "prompt": "x"},  # a field less: a conflict
    ]
    keys = {id_key(x) for x in settled}
    source = PromptSource(write_jsonl(rows), lambda key: "done" if key in keys else None)
    later = [(type(i).__name__, i.line) for i in source if getattr(i, "line", 0) > 2]
    assert later == [("BadRow", 3), ("BadRow", 5)]
    assert source.repeats == 1


def test_repeats_of_rows_skipped_unparsed(write_jsonl):
    """After a row is skipped by its id, an identical line is a repeat and a different one a conflict."""
    from gen_pipeline.records import id_key

    rows = [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "x"}, {"prompt": "y", "id": "a"}]
    source = PromptSource(write_jsonl(rows), lambda key: "done" if key == id_key("a") else None)
    items = list(source)
    assert [type(i).__name__ for i in items] == ["Skipped", "BadRow"]
    assert source.repeats == 1 and items[1].line == 3


@pytest.mark.parametrize("memo", ["dict", "compact"])
def test_repeats_of_settled_rows_with_the_compact_resume_state(write_jsonl, memo):
    """The same rules hold with store.KeySet / SettledRows (8 bytes per done id) as with a dict."""
    from gen_pipeline.records import id_key
    from gen_pipeline.resume.settled import ResumeState
    from gen_pipeline.rundir.donekeys import KeySet

    state = ResumeState(done=KeySet(id_key(x) for x in ("a", 5, "z")), last_reason={id_key("f"): "over_length"})
    rows = [
        {"id": "a", "prompt": "x"},  # done: skipped
        {"id": 5, "prompt": "five"},  # done: skipped
        {"id": "f", "prompt": "long"},  # settled by the ledger: skipped
        {"id": "n", "prompt": "new"},  # new: parsed
        {"id": "a", "prompt": "x"},  # the same line again: a repeat
        {"id": 5, "prompt": "FIVE"},  # other content under a done id: a conflict
        {"id": "f", "prompt": "long"},  # repeat of a ledger-settled row
        {"prompt": "y", "id": "a"},  # id not first (parsed), other content: a conflict
        {"prompt": "x", "id": "a"},  # the same object, keys in another order: a repeat
    ]
    plain = lambda key: state.settled(key, frozenset())  # noqa: E731
    source = PromptSource(write_jsonl(rows), state.rows(frozenset()) if memo == "compact" else plain)
    items = list(source)
    assert [(type(i).__name__, getattr(i, "line", None)) for i in items] == [
        ("Skipped", None),
        ("Skipped", None),
        ("Skipped", None),
        ("Prompt", 4),
        ("BadRow", 6),
        ("BadRow", 8),
    ]
    assert source.repeats == 3


@pytest.mark.parametrize("rid", ["a", "café-ü-你好", "0", 0, 7, -12, 10**18, "with space", "🙂"])
def test_peek_key_equals_id_key_of_the_parsed_id(rid):
    import orjson

    from gen_pipeline.records import id_key, peek_key

    line = orjson.dumps({"id": rid, "prompt": "p"})
    assert peek_key(line) == (rid, id_key(rid))
    assert peek_key(b'{"prompt": "p", "id": 1}') is None


@pytest.mark.parametrize("depth", [250, 254, 600, 1023])
def test_a_row_nested_too_deep_to_write_is_bad(write_jsonl, depth):
    """A row the parser reads but no output line could hold (orjson writes 254 levels) is a BadRow."""
    deep = b'{"id": "d", "prompt": "hi", "extra": ' + b"[" * depth + b"]" * depth + b"}"
    items = list(PromptSource(write_jsonl([deep, GOOD])))
    assert isinstance(items[0], BadRow) and items[0].line == 1 and "nested" in items[0].detail
    assert items[1].id == "a"


def test_a_row_with_many_brackets_but_shallow_is_fine(write_jsonl):
    """Many brackets side by side (a long history, a string full of them) are no nesting."""
    row = {"id": "w", "prompt": "[" * 500, "extra": [[1]] * 400}
    [p] = list(PromptSource(write_jsonl([row])))
    assert p.meta == {"extra": [[1]] * 400}
