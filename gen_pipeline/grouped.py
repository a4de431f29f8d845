"""`export --group-samples`: one row per prompt with the list of its samples, the shape preference-data
and best-of-n tools read.

    {"id": "q1", "messages": [prompt turns], "completions": ["...", "..."], "sample": [0, 1],
     "finish_reason": ["stop", "length"], ...}

`id` stays one value per row; every other chosen column becomes a list in sample order. The samples of
one prompt from different checkpoints are different rows (a row's samples share one checkpoint). The rows are
gathered in memory before they are written (the prompt turns once per prompt, the chosen columns per
sample), in the order each prompt's first line was met.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .exportconfig import column_value
from .records import id_key


def grouped_rows(lines: Iterable[dict[str, Any]], columns: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """One row per prompt from its kept completion lines, samples in order."""
    groups: dict[tuple[Any, int], tuple[dict[str, Any], list[tuple[int, str, list[Any]]]]] = {}
    for obj in lines:
        key = (obj.get("checkpoint"), id_key(obj["id"]))
        group = groups.get(key)
        if group is None:
            turns = [{"role": m.get("role"), "content": m.get("content")} for m in obj["messages"]]
            group = groups[key] = ({"id": column_value(obj, "id"), "messages": turns}, [])
        values = [column_value(obj, c) for c in columns if c != "id"]
        group[1].append((obj.get("sample") or 0, obj["completion"], values))
    for head, samples in groups.values():
        samples.sort(key=lambda s: s[0])
        row = {**head, "completions": [text for _, text, _ in samples]}
        listed = [c for c in columns if c != "id"]
        row.update((c, [values[i] for _, _, values in samples]) for i, c in enumerate(listed))
        yield {k: row.get(k) for k in ("messages", "completions", *columns)}


def grouped_features(columns: tuple[str, ...], types: dict[str, str]) -> Any:
    """The datasets schema of grouped rows: `id` a value, the other columns lists."""
    import datasets

    def value(c: str) -> Any:
        return datasets.Value(types.get(c, "string"))

    return datasets.Features(
        {
            "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
            "completions": datasets.Sequence(datasets.Value("string")),
            **{c: value(c) if c == "id" else datasets.Sequence(value(c)) for c in columns},
        }
    )
