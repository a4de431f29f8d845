"""`gen-pipeline prepare`: its flags and the call into prepare/convert.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..inputs.formats import FORMATS
from ..prepare.convert import PrepareConfig, prepare
from ..rundir.layout import write_json_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `prepare` flags."""
    add = parser.add_argument
    add(
        "--input",
        "-i",
        action="append",
        required=True,
        metavar="SRC",
        help="JSONL/JSON/Parquet/CSV/TXT file, dataset folder or hub name (repeatable)",
    )
    add("--out", "-o", type=Path, required=True, help="prompts JSONL to write")
    add(
        "--exclude",
        action="append",
        type=Path,
        default=[],
        metavar="PATH",
        help="drop prompts already in this prompts file, run dir or JSONL folder (repeatable)",
    )
    add(
        "--format",
        choices=["auto", *FORMATS],
        default="auto",
        help="conversation format of every source (default: judged per row from its columns)",
    )
    add("--split", default="train", help="split of dataset sources (default train)")
    add("--subset", help="config name of a hub dataset")
    add("--limit", type=int, help="read at most N rows of each source")
    add("--streaming", action="store_true", help="stream a hub dataset instead of downloading it")
    add(
        "--keep-reference",
        action="store_true",
        help="keep the dropped answer as `reference` (meta.reference in the output)",
    )
    add(
        "--keep-turns",
        action="store_true",
        help="keep a conversation's system and user turns, for generate --turns all (deduplicated on them)",
    )
    add(
        "--group-prefixes",
        action="store_true",
        help="write rows that begin alike (one conversation's turns) together, the longest first: "
        "generate then finds their shared prefix in the server's cache",
    )
    add("--report", type=Path, help="also write the counts to this JSON file")


def main(args: argparse.Namespace) -> int:
    """Run `prepare` from parsed flags; print the one-line summary."""
    config = PrepareConfig(
        inputs=tuple(args.input),
        out=args.out,
        exclude=tuple(args.exclude),
        format=args.format,
        split=args.split,
        subset=args.subset,
        limit=args.limit,
        streaming=args.streaming,
        keep_reference=args.keep_reference,
        keep_turns=args.keep_turns,
        report=args.report,
        group_prefixes=args.group_prefixes,
    )
    report = prepare(config)
    if config.report is not None:
        write_json_atomic(config.report, report.to_dict())
    print(report.line(config.out))
    return 0
