"""`gen-pipeline export`: run directories become a training dataset.

    gen-pipeline export runs/nightly --out datasets/nightly --drop-truncated \\
        --columns id,finish_reason,prompt_tokens,completion_tokens,model,meta.source_id

One row per completion (per sample of a prompt, with its `sample` column): `messages` (the prompt turns
plus the new assistant turn) and the chosen columns; `--group-samples` makes one row per prompt with the
list of its completions (see grouped.py). Written as Parquet shards under OUT/data/ (the hub's layout)
or, with --save-to-disk, as a `datasets` folder; OUT/README.md is a dataset card with the counts and the
generation settings. Nothing in the run directory is changed; a torn last line is skipped, and an
(id, sample) seen twice from the same checkpoint is exported once: the answers of different checkpoints to
the same ids (two runs over the same prompts, an A/B of two teachers) are all kept, side by side, with the
`checkpoint` column naming each row's (export refuses runs of several checkpoints without that column;
`--group-samples` groups within a checkpoint). A claimed-shard run (claims.py) is checked as a whole: it is
refused while shards are open (unless --partial), and a key found twice in its shard files is an error
that names the keys (the claim protocol writes each key once; two copies mean the protocol was broken).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .card import dataset_card
from .errors import ConfigError, ExportCheckError
from .formats import jsonl_rows
from .provenance import checkpoint_key, unnamed_checkpoints
from .records import id_key
from .report import completion_files
from .rundir import read_manifest
from .samples import place_key, record_place

DEFAULT_COLUMNS = ("id", "sample", "finish_reason", "prompt_tokens", "completion_tokens", "model", "checkpoint")
DEFAULT_SHARD_ROWS = 100_000
# The completion fields a dataset may carry, with their Arrow types; "meta.KEY" columns are strings.
_STRINGS: tuple[str, ...] = ("id", "completion", "reasoning_content", "finish_reason", "server", "model", "meta")
_STRINGS += ("truncated_in", "logprobs")  # logprobs: the server's JSON, as a string
_STRINGS += ("checkpoint", "weight_version")  # what wrote the row (provenance.py)
_STRINGS += ("truncated_in", "logprobs", "usage_invalid", "server_usage")  # logprobs, server_usage: JSON strings
_INTS = ("input_tokens", "prompt_tokens", "completion_tokens", "max_tokens", "attempts", "sample", "reasoning_tokens")
COLUMN_TYPES = dict.fromkeys(_STRINGS, "string") | dict.fromkeys(_INTS, "int64")
COLUMN_TYPES["latency_s"] = COLUMN_TYPES["time"] = "float64"


@dataclass(frozen=True)
class ExportConfig:
    """What one `export` reads and writes.

    Attributes:
        runs: run directories (completions*.jsonl, failures.jsonl, manifest.json), read in order.
        out: the dataset folder to create. overwrite: replace it if it exists.
        columns: columns besides `messages`: completion fields or "meta.KEY".
        drop_truncated: leave out completions that stopped at max_tokens (finish_reason "length").
        drop_truncated_reasoning: leave out only those cut while still reasoning (truncated_in "reasoning").
        group_samples: one row per prompt with the list of its samples' completions.
        save_to_disk: a `datasets` folder instead of Parquet shards. shard_rows: rows per shard.
        push_to_hub: also push to this hub dataset repo (private if `private`).
    """

    runs: tuple[Path, ...]
    out: Path
    columns: tuple[str, ...] = DEFAULT_COLUMNS
    drop_truncated: bool = False
    drop_truncated_reasoning: bool = False
    group_samples: bool = False
    save_to_disk: bool = False
    shard_rows: int = DEFAULT_SHARD_ROWS
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False
    partial: bool = False  # export a claimed-shard run with open shards
    drop_incomplete: bool = False  # a --turns all run: leave out conversations that ended early

    def __post_init__(self) -> None:
        unknown = [c for c in self.columns if c not in COLUMN_TYPES and not c.startswith("meta.")]
        if unknown:
            known = ", ".join(COLUMN_TYPES)
            raise ConfigError(f"unknown --columns {unknown}; use {known} or meta.KEY")
        if self.shard_rows < 1:
            raise ConfigError("--shard-rows must be at least 1")
        for run in self.runs:
            if not completion_files(run):
                raise ConfigError(f"{run} is not a run directory (no completions*.jsonl)")
        if self.out.exists() and any(self.out.iterdir()) and not self.overwrite:
            raise ConfigError(f"{self.out} exists and is not empty; use --overwrite to replace it")
        if self.turns and self.group_samples:
            raise ConfigError("--group-samples: a --turns all run exports one row per conversation")
        if self.drop_incomplete and not self.turns:
            raise ConfigError("--drop-incomplete is for runs made with --turns all")

    @property
    def turns(self) -> bool:
        """Whether the runs were made with --turns all (one row per conversation: turnexport.py)."""
        from .turnexport import turns_runs

        return turns_runs(self.runs)


@dataclass
class ExportStats:
    """What went into the dataset and what was left out."""

    rows: int = 0
    truncated: int = 0
    truncated_in_reasoning: int = 0  # of the rows kept
    duplicates: int = 0
    unreadable: int = 0
    finish_reasons: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    kept: set[int] = field(default_factory=set)  # (id, sample) keys kept, each mixed with its checkpoint's
    twice: list[str] = field(default_factory=list)  # keys a claimed-shard run holds more than once
    checkpoints: Counter[str] = field(default_factory=Counter)  # rows kept per checkpoint ("" not named)
    conversations: Counter[str] = field(default_factory=Counter)  # --turns all: "complete", "ended_early"
    conversations_left_out: int = 0  # --turns all: with a turn left out, or (--drop-incomplete) ended early

    def add(self, obj: dict[str, Any]) -> None:
        self.rows += 1
        self.checkpoints[str(obj.get("checkpoint") or "")] += 1
        self.truncated_in_reasoning += obj.get("truncated_in") == "reasoning"
        self.finish_reasons[str(obj.get("finish_reason"))] += 1
        self.prompt_tokens += obj.get("prompt_tokens") or 0
        self.completion_tokens += obj.get("completion_tokens") or 0


def check_settled(config: ExportConfig) -> None:
    """Refuse a claimed-shard run whose shards are not all settled (unless --partial)."""
    from .claimstatus import open_shards

    for run in config.runs:
        manifest = read_manifest(run)
        if manifest.get("shards") is None or config.partial:
            continue
        if left := open_shards(run, manifest):
            raise ExportCheckError(
                f"{run}: {left} of {manifest['shards']} shards are not settled; finish the run "
                "(the same generate command, or more claimers), or export what is there with --partial"
            )


def _is_completion(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and obj.get("id") is not None
        and isinstance(obj.get("messages"), list)
        and isinstance(obj.get("completion"), str)
    )


def _value(obj: dict[str, Any], column: str) -> Any:
    """One column of a training row; ids and meta values become strings for a stable schema."""
    if column.startswith("meta."):
        value = (obj.get("meta") or {}).get(column[5:])
    elif column in ("id", "meta", "logprobs", "server_usage"):
        value = obj.get(column)
    else:
        return obj.get(column)
    return value if value is None or isinstance(value, str) else orjson.dumps(value).decode()


def training_row(obj: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """A completion line as a training row: prompt turns plus the new assistant turn."""
    turns = [{"role": m.get("role"), "content": m.get("content")} for m in obj["messages"]]
    row = {"messages": [*turns, {"role": "assistant", "content": obj["completion"]}]}
    row.update((c, _value(obj, c)) for c in columns)
    return row


def kept_completions(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """Every exportable completion line of every run, once per (id, sample), counted into `stats`."""
    for run in config.runs:
        whole = read_manifest(run).get("shards") is not None  # a claimed-shard run: each key once, checked
        seen: dict[int, Path] = {}
        for f in completion_files(run):
            yield from _kept(config, stats, f, seen if whole else None)


def _kept(config: ExportConfig, stats: ExportStats, f: Path, seen: dict[int, Path] | None) -> Iterator[dict[str, Any]]:
    """kept_completions for one file; `seen`: the keys of this claimed-shard run so far and their files."""
    for obj in jsonl_rows(f):
        place = record_place(obj) if _is_completion(obj) else None
        if place is None:
            stats.unreadable += 1
            continue
        key = place_key(id_key(obj["id"]), *place)
        if seen is not None:
            if key in seen:
                turn = f" turn {place[1]}" if "turn" in obj else ""
                stats.twice.append(f"id {obj['id']!r} sample {place[0]}{turn} ({seen[key]} and {f})")
            seen.setdefault(key, f)
        mixed = checkpoint_key(key, obj)
        if mixed in stats.kept:
            stats.duplicates += 1
        elif _dropped(config, obj):
            stats.truncated += 1
        else:
            stats.kept.add(mixed)
            stats.add(obj)
            yield obj


def _dropped(config: ExportConfig, obj: dict[str, Any]) -> bool:
    """Whether --drop-truncated (any cut) or --drop-truncated-reasoning (a cut while thinking) leaves it out."""
    if config.drop_truncated and obj.get("finish_reason") == "length":
        return True
    return config.drop_truncated_reasoning and obj.get("truncated_in") == "reasoning"


def training_rows(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """Every exportable completion as a training row (or, with group_samples, every prompt's group; of a
    --turns all run, every conversation)."""
    if config.turns:
        from .turnexport import conversation_rows

        yield from conversation_rows(config, stats)
        return
    if config.group_samples:
        from .grouped import grouped_rows

        yield from grouped_rows(kept_completions(config, stats), config.columns)
        return
    for obj in kept_completions(config, stats):
        yield training_row(obj, config.columns)


def build_dataset(config: ExportConfig, stats: ExportStats, cache_dir: Path) -> Any:
    """The dataset, streamed to Arrow files under `cache_dir` (never the whole run in memory)."""
    import datasets

    if config.turns:
        from .turnexport import conversation_features

        features = conversation_features(config.columns, COLUMN_TYPES)
    elif config.group_samples:
        from .grouped import grouped_features

        features = grouped_features(config.columns, COLUMN_TYPES)
    else:
        features = datasets.Features(
            {
                "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
                **{c: datasets.Value(COLUMN_TYPES.get(c, "string")) for c in config.columns},
            }
        )
    kwargs = {"config": config, "stats": stats}
    try:
        return datasets.Dataset.from_generator(
            training_rows, gen_kwargs=kwargs, features=features, cache_dir=str(cache_dir)
        )
    except ValueError:
        if stats.rows:
            raise
        # datasets refuses to build an empty split from a generator
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)


def write_dataset(ds: Any, out: Path, config: ExportConfig) -> None:
    """Parquet shards under out/data/, or a save_to_disk folder."""
    if config.save_to_disk:
        ds.save_to_disk(str(out))
        return
    shards = max(1, -(-len(ds) // config.shard_rows))
    (out / "data").mkdir(parents=True)
    for i in range(shards):
        part = ds.shard(shards, i, contiguous=True)
        part.to_parquet(str(out / "data" / f"train-{i:05d}-of-{shards:05d}.parquet"))


def export(config: ExportConfig) -> ExportStats:
    """Build the dataset and its card in a temporary folder, then move it to `config.out`."""
    check_settled(config)
    if (refused := unnamed_checkpoints([read_manifest(run) for run in config.runs], config.columns)) is not None:
        raise ExportCheckError(refused)
    config.out.parent.mkdir(parents=True, exist_ok=True)
    stats = ExportStats()
    with tempfile.TemporaryDirectory(dir=config.out.parent, prefix=".export-") as tmp:
        ds = build_dataset(config, stats, Path(tmp) / "cache")
        if stats.twice:
            del ds
            shown = "; ".join(stats.twice[:5]) + (f"; and {len(stats.twice) - 5} more" if len(stats.twice) > 5 else "")
            raise ExportCheckError(f"{len(stats.twice)} keys are in the run's shard files more than once: {shown}")
        staged = Path(tmp) / "out"
        write_dataset(ds, staged, config)
        (staged / "README.md").write_text(dataset_card(config, stats), encoding="utf-8")
        if config.push_to_hub:
            push(ds, staged / "README.md", config)
        del ds
        if config.out.exists():
            shutil.rmtree(config.out)
        staged.rename(config.out)
    return stats


def push(ds: Any, card: Path, config: ExportConfig) -> None:
    """Push the dataset and its card to the hub (needs a token and network)."""
    from huggingface_hub import HfApi

    assert config.push_to_hub is not None
    ds.push_to_hub(config.push_to_hub, private=config.private)
    api = HfApi()
    api.upload_file(
        path_or_fileobj=str(card), path_in_repo="README.md", repo_id=config.push_to_hub, repo_type="dataset"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `export` flags."""
    add = parser.add_argument
    add("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories to export")
    add("--out", "-o", type=Path, required=True, help="dataset folder to create")
    add(
        "--columns",
        default=",".join(DEFAULT_COLUMNS),
        help="columns besides messages: completion fields or meta.KEY, comma separated "
        f"(default {','.join(DEFAULT_COLUMNS)})",
    )
    add("--drop-truncated", action="store_true", help='leave out finish_reason "length" rows')
    add(
        "--drop-truncated-reasoning",
        action="store_true",
        help='leave out only the rows cut while still reasoning (truncated_in "reasoning")',
    )
    add("--group-samples", action="store_true", help="one row per prompt with the list of its completions")
    add("--save-to-disk", action="store_true", help="write a datasets folder instead of Parquet")
    add("--shard-rows", type=int, default=DEFAULT_SHARD_ROWS, help="rows per Parquet shard")
    add("--overwrite", action="store_true", help="replace --out if it exists")
    add("--push-to-hub", metavar="REPO", help="also push to this hub dataset repo")
    add("--private", action="store_true", help="make the pushed repo private")
    add("--partial", action="store_true", help="export a claimed-shard run whose shards are not all settled")
    add("--drop-incomplete", action="store_true", help="a --turns all run: leave out conversations that ended early")


def main(args: argparse.Namespace) -> int:
    """Run `export` from parsed flags; print the one-line summary."""
    config = ExportConfig(
        runs=tuple(args.runs),
        out=args.out,
        columns=tuple(c.strip() for c in args.columns.split(",") if c.strip()),
        drop_truncated=args.drop_truncated,
        drop_truncated_reasoning=args.drop_truncated_reasoning,
        group_samples=args.group_samples,
        save_to_disk=args.save_to_disk,
        shard_rows=args.shard_rows,
        overwrite=args.overwrite,
        push_to_hub=args.push_to_hub,
        private=args.private,
        partial=args.partial,
        drop_incomplete=args.drop_incomplete,
    )
    stats = export(config)
    if config.turns:
        kept = sum(stats.conversations.values()) - stats.conversations_left_out
        print(f"export: {kept} conversations {dict(stats.conversations)} from {stats.rows} turns")
    print(
        f"export: {stats.rows} rows -> {config.out} (left out: {stats.truncated} truncated, "
        f"{stats.duplicates} duplicates, {stats.unreadable} unreadable lines)"
        + (f"; rows of {len(stats.checkpoints)} checkpoints" if len(stats.checkpoints) > 1 else "")
    )
    return 0


if __name__ == "__main__":
    from .cli import main as cli_main

    sys.exit(cli_main(["export", *sys.argv[1:]]))
