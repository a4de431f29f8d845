"""`export` of a `--turns all` run: one row per conversation, (id, sample), the shape chat-model training reads.

    {"messages": [system, user, assistant, user, assistant, ...], "conversation": "complete", "turns": 2,
     "id": "c1", "sample": 0, ...}

`messages` is the regenerated conversation: the last answered turn's request (which holds every earlier
turn, with the target's own answers) and its answer; an assistant turn carries its `reasoning_content`
when the server sent one, and every turn its tool calls, ids and names (trainrow.py), beside the request's
tools, chat_template_kwargs and sampling. `conversation` says whether every user turn of the row was answered
("complete") or the conversation ended early (a turn that no longer fit, or one not answered yet);
`--drop-incomplete` leaves those out. The other columns are the last turn's. A conversation with a turn
that export leaves out (`--drop-truncated`) is left out whole: a conversation with a hole is no data.

Two passes over the output: the first finds each conversation's last turn (one int per conversation in
memory), the second writes the line of that turn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from ..fleet.provenance import checkpoint_key
from ..inputs.formats import jsonl_rows
from ..records import id_key
from ..samples import record_place, sample_key
from ..views.rundata import completion_files
from .exportconfig import REQUEST_COLUMNS, ExportConfig, ExportStats, is_completion
from .trainrow import server_kind, training_row, turn_features

TURN_COLUMNS = {"conversation": "string", "turns": "int64"}  # the columns a conversation row adds


def conversation_rows(
    config: ExportConfig, stats: ExportStats, completions: Iterable[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """One training row per conversation of the runs, in the order their last turns were written;
    `completions`: the runs' kept completion lines (export.kept_completions)."""
    last: dict[int, int] = {}
    kept: Counter[int] = Counter()
    for obj in completions:
        key, turn = _conversation(obj)
        kept[key] += 1
        last[key] = max(last.get(key, -1), turn)
    for f in (f for run in config.runs for f in completion_files(run)):
        for obj in jsonl_rows(f):
            if not is_completion(obj) or record_place(obj) is None:
                continue
            key, turn = _conversation(obj)
            if last.get(key) != turn:
                continue
            del last[key]
            row = _row(obj, turn, kept[key], config, stats)
            if row is not None:
                yield row


def _conversation(obj: dict[str, Any]) -> tuple[int, int]:
    """The (id, sample) key of a line's conversation, mixed with its checkpoint's (two checkpoints' answers to
    one conversation are two conversations; turns of one written by another checkpoint are not its own), and
    its turn."""
    place = record_place(obj)
    assert place is not None
    return checkpoint_key(sample_key(id_key(obj["id"]), place[0]), obj), place[1]


def _row(obj: dict[str, Any], turn: int, kept: int, config: ExportConfig, stats: ExportStats) -> dict[str, Any] | None:
    if kept != turn + 1:
        stats.conversations_left_out += 1  # a turn of it was left out (--drop-truncated)
        return None
    complete = obj.get("turns") == turn + 1
    stats.conversations[("complete" if complete else "ended_early")] += 1
    if config.drop_incomplete and not complete:
        stats.conversations_left_out += 1
        return None
    row = training_row(obj, config.columns, server_kind(config))  # the last turn's request holds every turn
    row.update(conversation="complete" if complete else "ended_early", turns=turn + 1)
    return row


def conversation_features(columns: tuple[str, ...], types: dict[str, str]) -> Any:
    """The datasets schema of conversation rows: every turn as trainrow.py writes it, and the conversation columns."""
    import datasets

    return datasets.Features(
        {
            "messages": [turn_features()],
            **dict.fromkeys(REQUEST_COLUMNS, datasets.Value("string")),
            **{c: datasets.Value(t) for c, t in TURN_COLUMNS.items()},
            **{c: datasets.Value(types.get(c, "string")) for c in columns},
        }
    )
