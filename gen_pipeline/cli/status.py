"""`gen-pipeline status DIR`: its flags and the call into views/status.py."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..views.status import inspect_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `status` flags."""
    parser.add_argument("dir", type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="print again every SECONDS until Ctrl-C")


def main(args: argparse.Namespace) -> int:
    """Print the run's status (once, or every --watch seconds); exit 0 while it runs or once it finished
    well, 3 when it is not running (crashed, killed, stopped, finished with another exit code)."""
    text, code = inspect_run(args.dir)
    print(text, flush=True)  # flushed: a reader such as `| head` sees each view as it comes
    if not args.watch:
        return code
    try:
        while True:
            time.sleep(args.watch)
            text, code = inspect_run(args.dir)
            print(f"\n{text}", flush=True)
    except KeyboardInterrupt:
        return code
