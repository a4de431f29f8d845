"""What a running `generate` shows: a progress bar or log lines, and whether it runs in a notebook.

In a Jupyter notebook stderr is no terminal, so "auto" would pick log lines, which a kernel does not show
(nothing configures logging there): a cell showed neither progress nor a summary. A notebook gets tqdm's
notebook bar instead (tqdm.auto: its text bar where ipywidgets is missing), and the Python API prints the
summary the command prints (api.py).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

log = logging.getLogger("gen_pipeline")

LOG_INTERVAL = 30.0


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython's shell there carries the kernel app's config); False
    in a script, a terminal IPython and wherever IPython is not even imported."""
    ipython = sys.modules.get("IPython")
    get_shell = getattr(ipython, "get_ipython", None)
    shell = get_shell() if callable(get_shell) else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class Progress:
    """A tqdm bar on a terminal or in a notebook, a plain log line every LOG_INTERVAL seconds otherwise."""

    def __init__(self, mode: str, total: int | None = None) -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() or in_notebook() else "log"
        self.mode = mode
        self._last_log = time.monotonic()
        self.bar: Any = None
        if mode == "bar":  # imported only for a bar: 0.05 s of every other run's start-up (log, off, workers)
            from tqdm.auto import tqdm  # in a notebook, its widget bar (the text bar without ipywidgets)

            self.bar = tqdm(total=total, unit="row", dynamic_ncols=True)

    def update(self, settled: int, line: str) -> None:
        """Refresh the display: rows settled so far (done, skipped as settled before, or ledgered) and the
        progress line (stats.progress_line)."""
        if self.bar is not None:
            self.bar.n = settled
            self.bar.set_postfix_str(line, refresh=True)
        elif self.mode == "log" and time.monotonic() - self._last_log >= LOG_INTERVAL:
            self._last_log = time.monotonic()
            log.info("progress: %s", line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def duration(seconds: float) -> str:
    """Seconds as "1h 02m", "3m 04s" or "5 s"."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s} s"
