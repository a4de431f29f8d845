"""The answer checks: each a small callable that takes an Answer and returns why it is not one to keep
(a Verdict), or None.

Hygiene checks are always on; they look at what every run would drop from a dataset:
- `empty`: no answer text and no tool calls, though the server sent something (its thinking); a 200 with
  nothing at all is the server's fault instead (errors.EmptyCompletionError);
- `unfinished_reasoning`: cut at max_tokens while still thinking, so there is no answer yet;
- `think_marker`: a `<think>`/`</think>` left in the answer: the server split the thinking out and a marker
  stayed behind, or a marker stands after the answer's leading thinking block.
`--validate json`, `--json-schema FILE`, `--validate regex:PATTERN` and `--validate python:MODULE:FUNCTION`
check the answer's text (validate.py builds them from the flags). An answer made only of tool calls has no
text: the text checks pass it, the hygiene checks and the user's functions see it whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from ..records import Messages, RowId

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DETAIL_CHARS = 300  # a verdict's detail is cut to this (the answer itself is kept whole in rejected.jsonl)


@dataclass(frozen=True)
class Answer:
    """One answer as the checks (and a `--validate python:` function) see it.

    Attributes:
        content: the message content as the server sent it.
        text: the answer itself, stripped: `content`, without a leading thinking block (`<think>...</think>`,
            or everything up to a first `</think>` when the template opened the block) unless the server split
            the thinking out into `reasoning`.
        reasoning: the thinking the server split out (`reasoning_content`), or None.
        tool_calls: the tool calls the answer made, or None.
        finish_reason: "stop", "length", "tool_calls", ...
        messages: the conversation the answer answers (the request's messages).
        id / sample / turn: which answer of the run it is (turn: None unless --turns all).
        meta: the row's other fields (the input row's `meta`).
    """

    content: str
    reasoning: str | None = None
    tool_calls: list[Any] | None = None
    finish_reason: str | None = None
    messages: Messages = field(default_factory=list)
    id: RowId = ""
    sample: int = 0
    turn: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        # a server that split the thinking out (reasoning set) left the answer alone in content
        return self.content.strip() if self.reasoning is not None else answer_text(self.content)


class Verdict(NamedTuple):
    """Why an answer is not kept: the check that refused it and what it found."""

    check: str
    detail: str


Check = Callable[[Answer], Verdict | None]


def answer_text(content: str) -> str:
    """The answer without its leading thinking block: what follows the first `</think>` when the content
    opens with one or holds one before any other marker (the template opened the block), else all of it."""
    body = content.lstrip()
    close = body.find(THINK_CLOSE)
    opens = body.find(THINK_OPEN)
    if close >= 0 and (opens < 0 or opens == 0 or opens > close):
        return body[close + len(THINK_CLOSE) :].strip()
    return body.strip()


def excerpt(text: str, limit: int = 80) -> str:
    """A short quote of `text` for a verdict's detail."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


# hygiene


def unfinished_reasoning(answer: Answer) -> Verdict | None:
    """Cut at max_tokens while still thinking: the reasoning never ended, there is no answer."""
    if answer.finish_reason != "length" or answer.tool_calls:
        return None
    if not answer.content.strip() and answer.reasoning:
        return Verdict("unfinished_reasoning", "cut at max_tokens while still reasoning (no answer)")
    body = answer.content.lstrip()
    if body.startswith(THINK_OPEN) and THINK_CLOSE not in body:
        return Verdict("unfinished_reasoning", "cut at max_tokens inside <think> (no answer)")
    return None


def empty(answer: Answer) -> Verdict | None:
    """No answer text and no tool calls, though the server sent its thinking (or only whitespace)."""
    if answer.tool_calls or answer.text:
        return None
    return Verdict("empty", f"no answer text (finish_reason {answer.finish_reason!r})")


def think_marker(answer: Answer) -> Verdict | None:
    """A think marker left in the answer."""
    if answer.reasoning is not None:  # the server splits the thinking out: no marker belongs in the content
        where = answer.content
    else:
        where = answer.text
        if answer.content.lstrip().startswith(THINK_OPEN) and THINK_CLOSE not in answer.content:
            return Verdict("think_marker", "<think> is never closed")
    for marker in (THINK_OPEN, THINK_CLOSE):
        at = where.find(marker)
        if at >= 0:
            return Verdict("think_marker", f"{marker} left in the answer: {excerpt(where[max(0, at - 40) :])}")
    return None


HYGIENE: tuple[Check, ...] = (unfinished_reasoning, empty, think_marker)


# the checks a run asks for


def json_answer(answer: Answer) -> Verdict | None:
    """--validate json: the answer's text parses as JSON."""
    if answer.tool_calls and not answer.text:
        return None
    try:
        orjson.loads(answer.text)
    except orjson.JSONDecodeError as exc:
        return Verdict("json", f"not JSON ({exc}): {excerpt(answer.text)}")
    return None


@dataclass(frozen=True)
class RegexCheck:
    """--validate regex:PATTERN: the answer's text contains a match (re.search; anchor it with ^...$)."""

    pattern: re.Pattern[str]

    def __call__(self, answer: Answer) -> Verdict | None:
        if answer.tool_calls and not answer.text:
            return None
        if self.pattern.search(answer.text) is not None:
            return None
        return Verdict("regex", f"no match for {self.pattern.pattern!r}: {excerpt(answer.text)}")


@dataclass(frozen=True)
class SchemaCheck:
    """--json-schema FILE: the answer's text is JSON that the schema accepts (the jsonschema library)."""

    validator: Any  # a jsonschema validator for the schema

    def __call__(self, answer: Answer) -> Verdict | None:
        if answer.tool_calls and not answer.text:
            return None
        try:
            value = orjson.loads(answer.text)
        except orjson.JSONDecodeError as exc:
            return Verdict("schema", f"not JSON ({exc}): {excerpt(answer.text)}")
        error = next(iter(self.validator.iter_errors(value)), None)
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "(the root)"
        return Verdict("schema", f"at {where}: {error.message}"[:DETAIL_CHARS])
