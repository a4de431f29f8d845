"""`export --rejected`: the rejected answers (rejected.jsonl) as a dataset beside the accepted ones, OUT/rejected/,
in the conversational preference shape: `prompt` (the request's turns), `rejected` (the answer a check refused)
and `chosen` (the answer that passed for the same (id, sample, turn), or none when none did), with why it was
rejected. One row per rejected attempt; a torn or unreadable line is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..records import id_key
from ..rundir.layout import RunDir
from ..rundir.store import iter_json_lines
from ..samples import place_key, record_place
from .exportconfig import ExportConfig, ExportStats
from .lines import unique_lines
from .trainrow import answer_turn, export_turn, server_kind, turn_features

REJECTED_DIR = "rejected"
_COLUMNS = {"id": "string", "sample": "int64", "turn": "int64", "attempt": "int64", "reason": "string"}
_COLUMNS |= {"check": "string", "detail": "string", "finish_reason": "string", "completion_tokens": "int64"}
_COLUMNS |= {"server": "string", "seed": "int64"}


def rejected_lines(config: ExportConfig) -> Iterator[dict[str, Any]]:
    """Every readable line of the runs' rejected.jsonl files, with its key."""
    for path in (p for run in config.runs for p in RunDir(run).rejected_files()):
        for _, obj in iter_json_lines(path):
            place = record_place(obj) if obj is not None and obj.get("id") is not None else None
            if obj is None or place is None or not isinstance(obj.get("completion"), str):
                continue
            obj["_key"] = place_key(id_key(obj["id"]), *place)
            yield obj


def chosen_answers(config: ExportConfig, keys: set[int]) -> dict[int, dict[str, Any]]:
    """The accepted answer (completion line) of each of these keys that has one."""
    found: dict[int, dict[str, Any]] = {}
    for obj in unique_lines(config, ExportStats()):
        place = record_place(obj)
        key = place_key(id_key(obj["id"]), *place) if place is not None else None
        if key in keys:
            found.setdefault(key, obj)
    return found


def preference_rows(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """One row per rejected answer: prompt, rejected, chosen (empty when no answer passed), and why."""
    kind = server_kind(config)
    lines = list(rejected_lines(config))
    chosen = chosen_answers(config, {obj["_key"] for obj in lines})
    for obj in lines:
        passed = chosen.get(obj["_key"])
        rejected = {
            "role": "assistant",
            "content": obj["completion"],
            "reasoning_content": obj.get("reasoning_content"),
        }
        stats.rejected += 1
        stats.rejected_with_chosen += passed is not None
        yield {
            "prompt": [export_turn(m, kind) for m in obj.get("messages") or []],
            "rejected": [export_turn(rejected, kind)],
            "chosen": [export_turn(answer_turn(passed), kind)] if passed is not None else [],
            **{c: _value(obj.get(c), t) for c, t in _COLUMNS.items()},
        }


def _value(value: Any, kind: str) -> Any:
    if kind == "int64":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None if value is None else str(value)


def write_rejected(config: ExportConfig, stats: ExportStats, staged: Path, cache_dir: Path) -> None:
    """OUT/rejected/: the preference rows as Parquet shards (or a save_to_disk folder)."""
    import datasets

    turns = [turn_features()]
    features = datasets.Features(
        {
            "prompt": turns,
            "rejected": turns,
            "chosen": turns,
            **{c: datasets.Value(t) for c, t in _COLUMNS.items()},
        }
    )
    kwargs = {"config": config, "stats": stats}
    try:
        ds = datasets.Dataset.from_generator(
            preference_rows, gen_kwargs=kwargs, features=features, cache_dir=str(cache_dir)
        )
    except ValueError:  # datasets refuses to build an empty split from a generator
        ds = datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    out = staged / REJECTED_DIR
    if config.save_to_disk:
        ds.save_to_disk(str(out))
        return
    shards = max(1, -(-len(ds) // config.shard_rows))
    out.mkdir(parents=True)
    for i in range(shards):
        ds.shard(shards, i, contiguous=True).to_parquet(str(out / f"train-{i:05d}-of-{shards:05d}.parquet"))
