"""The completion lines an export reads: every readable line of the runs once per (id, sample, turn) and
checkpoint, the ones the --drop-* flags leave out apart, and each row's line (of a --turns all run, each
conversation's last turn: turnexport.py). What is read, kept and left out is counted into ExportStats."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..fleet.provenance import checkpoint_key
from ..inputs.formats import jsonl_rows
from ..records import id_key
from ..resume.restarts import generations
from ..samples import place_key, record_place
from ..views.rundata import completion_files, read_manifest
from .exportconfig import ExportConfig, ExportStats, dropped, is_completion
from .turnexport import conversation_rows


def unique_lines(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """Every readable completion line of every run, once per (id, sample, turn) and checkpoint; unreadable and
    repeated lines are counted into `stats` (and a claimed-shard run's keys written twice, named)."""
    for run in config.runs:
        yield from run_lines(config, stats, run)


def run_lines(config: ExportConfig, stats: ExportStats, run: Path) -> Iterator[dict[str, Any]]:
    """unique_lines of one of the runs (the lines of the runs before it already in `stats.seen`)."""
    whole = read_manifest(run).get("shards") is not None  # a claimed-shard run: each key once, checked
    seen: dict[int, Path] = {}
    for f in completion_files(run):
        yield from _unique(stats, f, seen if whole else None, config.keep_colliding_ids)


def _unique(stats: ExportStats, f: Path, seen: dict[int, Path] | None, keep: bool) -> Iterator[dict[str, Any]]:
    """unique_lines for one file; `seen`: the keys of this claimed-shard run so far and their files. A line is
    a duplicate only when its prompt is the first one's too; another prompt under the same key collides
    (named in `stats.collided`, and kept when `keep`: --keep-colliding-ids)."""
    for obj in jsonl_rows(f):
        place = record_place(obj) if is_completion(obj) else None
        if place is None:
            stats.unreadable += 1
            continue
        key = place_key(id_key(obj["id"]), *place)
        if seen is not None:
            if key in seen:
                turn = f" turn {place[1]}" if "turn" in obj else ""
                stats.twice.append(f"id {obj['id']!r} sample {place[0]}{turn} ({seen[key]} and {f})")
            seen.setdefault(key, f)
        mixed, prompt = checkpoint_key(key, obj), prompt_digest(obj)
        first = stats.seen.get(mixed)
        if first is None:
            stats.seen[mixed] = prompt
        elif first == prompt:
            stats.duplicates += 1
            continue
        else:
            turn = f" turn {place[1]}" if "turn" in obj else ""
            stats.collided.append(f"id {obj['id']!r} sample {place[0]}{turn} ({f})")
            if not keep:
                continue
        yield obj


def prompt_digest(obj: dict[str, Any]) -> int:
    """What makes two lines of one (id, sample, turn) the same prompt: their messages (of a --turns all line,
    the user and system turns alone: its earlier answers are the model's own, and differ from run to run)."""
    messages = obj.get("messages")
    if "turn" in obj and isinstance(messages, list):
        messages = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "assistant")]
    data = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def kept_completions(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """Every exportable completion line of every run, once per (id, sample); the lines the --drop-* flags
    leave out are counted into `stats`."""
    for run in config.runs:
        gens = generations(run)  # an (id, sample) answered again: its newest restart generation's line stands
        for obj in run_lines(config, stats, run):
            if gens.superseded_line(obj):
                stats.superseded += 1
            elif dropped(config, obj):
                stats.truncated += 1
            else:
                yield obj


def answered_rows(config: ExportConfig, stats: ExportStats) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Each row's completion line (of a --turns all run, each conversation's last turn) with the columns a
    conversation adds; every line in a row and every row counted into `stats`."""
    if config.turns:
        yield from conversation_rows(config, stats, run_lines)
        return
    for obj in kept_completions(config, stats):
        stats.add(obj)
        stats.row(obj)
        yield obj, {}
