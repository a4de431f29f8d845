"""`--turns all`: a row's conversation replayed turn by turn, every answer the target model's own.

A row's messages are cut into segments, one per user turn: the user turn with the system (or developer)
turns before it since the last assistant turn. The row's own assistant turns are dropped: they are never
sent. Turn k's request is segment 0, the target's answer to it, segment 1, its answer, ... segment k.

Each answer is one output line keyed (id, sample, turn) (samples.place_key), whose `messages` are the
request it answered: the line of turn k-1 plus its `completion` (and `reasoning_content`) is the history
of turn k. So a resume needs nothing but the output: a conversation goes on at its first turn not done,
from the line of the turn before it (TurnHistory reads it). A conversation is settled when every turn is
done, or when a turn is under a permanent ledger reason (it ended there: over_length, context_overflow).
A conversation is read in its newest restart generation (samples.py); `stale` says when its recorded
history cannot be gone on from (the reader then answers it again from turn 0, in the next generation).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from ..inputs.rows import RowError
from ..records import Messages, Prompt, id_key
from ..rundir.donekeys import line_id
from ..samples import line_place, place_key

SYSTEM_ROLES = frozenset({"system", "developer"})


def split_turns(messages: Messages) -> list[Messages]:
    """The row's segments, one per user turn; RowError for a row that cannot be replayed."""
    segments: list[Messages] = []
    waiting: Messages = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool" or m.get("tool_calls"):
            raise RowError(
                f"--turns all cannot regenerate a conversation with tool turns (messages[{i}]): "
                "the tools' answers depend on the calls the target would make"
            )
        if role == "assistant":
            continue
        waiting.append(m)
        if role == "user":
            segments.append(waiting)
            waiting = []
    if not segments:
        raise RowError("--turns all: the conversation has no user turn")
    return segments


def answer_turn(content: str, reasoning: str | None) -> dict[str, Any]:
    """The assistant turn an answer adds to the history; its thinking as `reasoning_content`, the field
    the templates read (they drop or keep it as the model was trained: tokens.conversation shapes it)."""
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


def turn_request(history: Messages, segment: Messages) -> Messages:
    """Turn k's messages: the conversation so far (with the target's answers) and the next segment."""
    return [*history, *segment]


def recorded_history(line: dict[str, Any]) -> Messages:
    """The history a turn's line leaves for the next turn: its request and its answer."""
    return [*line["messages"], answer_turn(line["completion"], line.get("reasoning_content"))]


def stale(line: dict[str, Any], segments: list[Messages], retired: frozenset[str]) -> str | None:
    """Why a conversation cannot go on from the line of its last answered turn: "edited" when its user (and
    system) turns are no longer the row's first segments, "checkpoint" when a checkpoint no longer serving
    wrote it (`retired`: fingerprints); None when it can."""
    asked = [m for m in line["messages"] if not (isinstance(m, dict) and m.get("role") == "assistant")]
    if asked != [m for segment in segments for m in segment]:
        return "edited"
    return "checkpoint" if line.get("checkpoint") in retired else None


class TurnHistory:
    """Finds the output line of one (id, sample, turn) in the files a resume read; indexed on first use
    (one pass over the files: only conversations cut short by a crash or a transient failure need it)."""

    def __init__(self, files: Iterable[Path]) -> None:
        self.files = list(files)
        self._at: dict[int, tuple[int, int]] | None = None  # key -> (file number, offset)

    def line(self, prompt: Prompt, sample: int, turn: int, restart: int = 0) -> dict[str, Any] | None:
        """The recorded line of one turn (of restart generation `restart`); None when it cannot be found or
        is not a whole answer."""
        obj = self._line(place_key(prompt.key, sample, turn, restart))
        if obj is None or not isinstance(obj.get("messages"), list) or not isinstance(obj.get("completion"), str):
            return None
        return obj

    def _line(self, key: int) -> dict[str, Any] | None:
        if self._at is None:
            self._at = self._index()
        where = self._at.get(key)
        if where is None:
            return None
        with self.files[where[0]].open("rb") as f:
            f.seek(where[1])
            obj = orjson.loads(f.readline())
        return obj if isinstance(obj, dict) else None

    def _index(self) -> dict[int, tuple[int, int]]:
        at: dict[int, tuple[int, int]] = {}
        for n, path in enumerate(self.files):
            if not path.exists():
                continue
            offset = 0
            with path.open("rb") as f:
                for raw in f:
                    place = line_place(raw) if b'"turn"' in raw and raw.endswith(b"\n") else None
                    if place is not None and place[1] >= 0:
                        rid = line_id(raw)
                        if rid is not None:
                            at[place_key(id_key(rid), *place)] = (n, offset)
                    offset += len(raw)
        return at
