"""`generate`'s flags for the people watching a run: metrics, cost and alerts (one place, one call in the CLI)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_watch_flags(p: Any) -> None:
    """Into p (generate's "observability" group): --metrics-port/--metrics-host/--metrics-file
    (engine/metrics.py), --gpus-per-server (progress/cost.py), --stall-minutes/--on-stall (progress/alerts.py)."""
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics on http://HOST:P/metrics while the run lasts (--workers K: claimer i on P+i)",
    )
    p.add_argument("--metrics-host", default="0.0.0.0", help="the address --metrics-port listens on (default 0.0.0.0)")
    p.add_argument(
        "--metrics-file",
        type=Path,
        metavar="PATH",
        help="write the metrics to PATH every 2 s, atomically (node_exporter's textfile format; "
        "--workers K: claimer i writes PATH with .i before its suffix)",
    )
    p.add_argument("--metrics-worker", default="0", help=argparse.SUPPRESS)  # set by --workers K: the worker label
    p.add_argument(
        "--gpus-per-server",
        type=int,
        default=1,
        metavar="N",
        help="GPUs behind each server (tensor parallel size), for GPU-hours per million tokens (default 1)",
    )
    p.add_argument(
        "--stall-minutes",
        type=float,
        default=10.0,
        metavar="M",
        help="no completion for M minutes is a stall: flagged by status and the progress line (default 10)",
    )
    p.add_argument(
        "--on-stall",
        metavar="CMD",
        help="a shell command run once per stall ($GEN_PIPELINE_ALERT says what, $GEN_PIPELINE_OUT where)",
    )
