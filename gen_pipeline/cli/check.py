"""`gen-pipeline check`: generate's flags (--out optional) and the call into preflight/check.py."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from ..errors import EXIT_OK
from ..preflight import check
from ..preflight.check import EXIT_PROBLEMS, render_check, run_check
from ..rundir.layout import write_json_atomic
from .generate import add_run_flags, config_from_args, flag_groups


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `check` flags: generate's own, with --out optional, plus --json."""
    parser.epilog = check.__doc__.rsplit("\n\n", 1)[1] if check.__doc__ else None
    flag_groups(parser)["input and output"].add_argument(
        "--out", "-o", type=Path, help="a run directory to resume: what it settled is left out"
    )
    add_run_flags(parser, argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")


def main(args: argparse.Namespace) -> int:
    """Run the preflight from parsed flags; exit 0 when fine, 1 when a problem was found."""
    resume = args.out is not None
    config = config_from_args(argparse.Namespace(**{**vars(args), "out": args.out or Path(".")}))
    report = asyncio.run(run_check(config, resume=resume))
    print(render_check(report))
    if args.json:
        write_json_atomic(args.json, report)
    return EXIT_OK if report["ok"] else EXIT_PROBLEMS
