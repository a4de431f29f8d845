"""A row's conversation as it is sent: consecutive user turns merged, trailing assistant turns set aside.

Chat logs come as they were lived, not as a request:
- two user turns in a row (a user who sent two messages before the answer) are one turn, their texts
  joined with a blank line (`prepare` merges them the same way): a template, or `--turns all`, would
  otherwise put an answer nobody gave between them;
- under `--turns last`, a row that ends with assistant turns (the log's own answer) is answered from its
  last user turn (or tool result): the trailing assistant turns are not sent, and the first one's content
  is kept on the output line as `reference`. `--turns all` never sends a row's assistant turns anyway.

A row's id is its own, or the content id of its messages as written (records.content_id): shaping a row
never changes its id.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ..records import Messages
from ..tokens.conversation import content_texts
from .template import PromptTemplate

# The turns that ask the model for its next answer: a user's, or a tool's result after the model's call.
ASKING_ROLES = frozenset({"user", "tool"})
TURN_JOINER = "\n\n"  # between the texts of merged user turns


@dataclass(frozen=True)
class RowShape:
    """How one run makes prompts of rows: its --template (None: the rows' own messages) and --turns."""

    template: PromptTemplate | None = None
    turns: str = "last"

    @classmethod
    def of(cls, template: str | None, turns: str = "last") -> RowShape:
        """The shape for a run's --template text (compiled here) and --turns."""
        return cls(PromptTemplate(template) if template is not None else None, turns)


@dataclass(frozen=True, slots=True)
class Shaped:
    """A row's messages as sent, with what shaping changed: user turns merged away, assistant turns dropped
    from the end, and the first dropped one's content (the old answer)."""

    messages: Messages
    merged: int = 0
    dropped: int = 0
    reference: Any = None


def merge_user_turns(messages: Messages) -> tuple[Messages, int]:
    """The messages with each run of consecutive user turns made one (texts joined by a blank line; the first
    turn's other fields kept), and how many turns were merged away."""
    if not any(a.get("role") == b.get("role") == "user" for a, b in pairwise(messages)):
        return messages, 0
    out: Messages = []
    for m in messages:
        if out and m.get("role") == "user" and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": _text(out[-1].get("content")) + TURN_JOINER + _text(m.get("content"))}
        else:
            out.append(m)
    return out, len(messages) - len(out)


def _text(content: Any) -> str:
    """A user turn's text: its string, or its text parts joined (rows hold text parts only)."""
    return content if isinstance(content, str) else "".join(content_texts(content or []))


def trailing_answer(messages: Messages) -> tuple[Messages, int, Any]:
    """The messages up to the last user turn or tool result, how many assistant turns followed it, and the
    first one's content; (messages, 0, None) when the row does not end with an assistant turn."""
    end = len(messages)
    while end and messages[end - 1].get("role") == "assistant":
        end -= 1
    if end == len(messages) or end == 0 or messages[end - 1].get("role") not in ASKING_ROLES:
        return messages, 0, None
    return messages[:end], len(messages) - end, messages[end].get("content")


def shape_messages(messages: Messages, turns: str) -> Shaped:
    """A validated row's messages as the run sends them (see the module docstring)."""
    merged_messages, merged = merge_user_turns(messages)
    if turns != "last":
        return Shaped(merged_messages, merged)
    kept, dropped, reference = trailing_answer(merged_messages)
    return Shaped(kept, merged, dropped, reference)
