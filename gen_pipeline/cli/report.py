"""`gen-pipeline report DIR`: its flags and the call into views/report.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from ..rundir.layout import MANIFEST, SUMMARY
from ..views import report
from ..views.report import INSTALL_HINT, render_table
from ..views.rundata import completion_files, read_completions, read_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `report` flags."""
    parser.add_argument("dir", type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--out", "-o", type=Path, help="where the plots go (default RUN_DIR/report)")


def main(args: argparse.Namespace) -> int:
    """Print the table and write the plots."""
    run: Path = args.dir
    summary = read_json(run / SUMMARY)
    if not completion_files(run) and summary is None:
        raise ConfigError(f"{run} is not a run directory (no completions*.jsonl, no summary.json)")
    rows = read_completions(run)
    manifest = read_json(run / MANIFEST)
    print(render_table(run, rows, summary, manifest))
    if not len(rows):
        print("no completions yet: no plots")
    elif not report.has_matplotlib():
        print(INSTALL_HINT)
    else:
        from ..views.plots import write_plots

        for path in write_plots(rows, summary, manifest, args.out or run / "report"):
            print(f"wrote {path}")
    return 0
