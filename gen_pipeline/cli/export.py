"""`gen-pipeline export`: its flags and the call into export/export.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..export.counts import summary_lines
from ..export.export import export
from ..export.exportconfig import (
    DEFAULT_COLUMNS,
    DEFAULT_SHARD_ROWS,
    EXPORT_FORMATS,
    REASONING,
    ExportConfig,
    with_default_columns,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `export` flags."""
    add = parser.add_argument
    add("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories to export")
    add("--out", "-o", type=Path, required=True, help="dataset folder to create")
    add(
        "--columns",
        default="",
        help="more columns, comma separated: completion fields or meta.KEY, added to the default ones "
        f"({','.join(DEFAULT_COLUMNS)})",
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
    add(
        "--keep-colliding-ids",
        action="store_true",
        help="runs holding different prompts under one (id, sample): keep them all (refused by default; the same "
        "prompt twice is a duplicate, exported once)",
    )
    add(
        "--format",
        choices=EXPORT_FORMATS,
        default="dataset",
        help="dataset (Parquet or save_to_disk, with a card), openai-batch (the OpenAI Batch API's "
        'output.jsonl and errors.jsonl), or for draft-model trainers: conversations ({"id", "conversations"} '
        'lines) or text ({"id", "text"} lines rendered with the run\'s chat template), in OUT/train.jsonl',
    )
    add(
        "--reasoning",
        choices=REASONING,
        default="separate",
        help="--format conversations: an answer's reasoning as reasoning_content (separate), in its content as "
        "the chat template shows it, <think>...</think> (inline), or left out (drop)",
    )
    add("--drop-incomplete", action="store_true", help="a --turns all run: leave out conversations that ended early")
    add(
        "--rejected",
        action="store_true",
        help="also the rejected answers (rejected.jsonl) as preference data in OUT/rejected/: prompt, rejected, "
        "and chosen (the answer that passed for the same key, when one did), with the reason and check",
    )
    add(
        "--tokenizer",
        metavar="PATH",
        help="--format text: the run's tokenizer folder (or hub name) when it is not where the run's manifest "
        "says; its chat template must be the run's",
    )
    add(
        "--row-per-turn",
        action="store_true",
        help="a --turns all run as --format conversations or text: a row per assistant turn (id ...#turnK), "
        "its history's answers without their reasoning",
    )


def main(args: argparse.Namespace) -> int:
    """Run `export` from parsed flags; print the one-line summary."""
    config = ExportConfig(
        runs=tuple(args.runs),
        out=args.out,
        columns=with_default_columns(tuple(c.strip() for c in args.columns.split(",") if c.strip())),
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
        format=args.format,
        reasoning=args.reasoning,
        row_per_turn=args.row_per_turn,
        tokenizer=args.tokenizer,
        rejected=args.rejected,
        keep_colliding_ids=args.keep_colliding_ids,
    )
    stats = export(config)
    print("\n".join(summary_lines(config, stats)))
    return 0
