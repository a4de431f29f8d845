"""`export --group-samples`: one row per prompt with the list of its samples, the shape preference-data
and best-of-n tools read.

    {"id": "q1", "messages": [prompt turns], "tools": ..., "chat_template_kwargs": ...,
     "completions": ["...", "..."], "reasoning_content": [...], "tool_calls": [...], "sampling": [...],
     "sample": [0, 1], "finish_reason": ["stop", "length"], ...}

`id`, the prompt turns, `tools` and `chat_template_kwargs` are one value per row (the prompt's); each
sample's answer (`completions`, its `reasoning_content` and `tool_calls`, a JSON string), its `sampling`
(a sample's own seed) and every other chosen column are lists in sample order. The samples of one prompt from different
checkpoints are different rows (a row's samples share one checkpoint). The rows are gathered in
memory before they are written (the prompt once per prompt, the rest per sample), in the order each
prompt's first line was met.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..records import id_key
from .exportconfig import ExportStats, column_value
from .trainrow import export_turn, request_columns, turn_features

PROMPT_COLUMNS = ("id", "tools", "chat_template_kwargs")  # one value per row
ANSWER_COLUMNS = ("reasoning_content", "tool_calls", "sampling")  # always listed beside `completions`


def grouped_rows(
    lines: Iterable[dict[str, Any]], columns: tuple[str, ...], kind: str = "sglang", stats: ExportStats | None = None
) -> Iterator[dict[str, Any]]:
    """One row per prompt from its kept completion lines, samples in order (each line and row counted into
    `stats`)."""
    stats = stats if stats is not None else ExportStats()
    listed = _listed(columns)
    groups: dict[tuple[Any, int], tuple[dict[str, Any], list[tuple[int, str, list[Any]]]]] = {}
    for obj in lines:
        stats.add(obj)
        key = (obj.get("checkpoint"), id_key(obj["id"]))
        group = groups.get(key)
        if group is None:
            head = {"id": column_value(obj, "id"), "messages": [export_turn(m, kind) for m in obj["messages"]]}
            group = groups[key] = ({**head, **request_columns(obj)}, [])
        group[1].append((obj.get("sample") or 0, obj["completion"], [column_value(obj, c) for c in listed]))
    for (checkpoint, _), (head, samples) in groups.items():
        stats.row({"checkpoint": checkpoint})
        samples.sort(key=lambda s: s[0])
        row = {**head, "completions": [text for _, text, _ in samples]}
        row.update((c, [values[i] for _, _, values in samples]) for i, c in enumerate(listed))
        yield {k: row.get(k) for k in ("messages", "completions", *PROMPT_COLUMNS, *listed)}


def _listed(columns: tuple[str, ...]) -> list[str]:
    """The per-sample columns: the answer's own, then the chosen ones (the prompt's left out)."""
    return list(dict.fromkeys(c for c in (*ANSWER_COLUMNS, *columns) if c not in PROMPT_COLUMNS))


def grouped_features(columns: tuple[str, ...], types: dict[str, str]) -> Any:
    """The datasets schema of grouped rows: the prompt's values, the samples' lists."""
    import datasets

    def value(c: str) -> Any:
        return datasets.Value(types.get(c, "string"))

    return datasets.Features(
        {
            "messages": [turn_features()],
            "completions": datasets.Sequence(datasets.Value("string")),
            **{c: value(c) for c in PROMPT_COLUMNS},
            **{c: datasets.Sequence(value(c)) for c in _listed(columns)},
        }
    )
