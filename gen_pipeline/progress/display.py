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
    """A tqdm bar on a terminal or in a notebook, a plain log line every LOG_INTERVAL seconds otherwise.
    Both show how far the run is: settled/total units, the percentage and the ETA, once the total is known."""

    def __init__(self, mode: str, unit: str = "row") -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() or in_notebook() else "log"
        self.mode, self.unit = mode, unit
        self._last_log = time.monotonic()
        self.bar: Any = None
        if mode == "bar":  # imported only for a bar: 0.05 s of every other run's start-up (log, off, workers)
            self.bar = run_bar(unit)

    def update(self, settled: int, line: str, total: int | None = None, rate: float | None = None) -> None:
        """Refresh the display: units settled so far (done, skipped as settled before, or ledgered) of
        `total`, the rate the ETA uses (units a second; None: unknown, as during an outage), and the
        progress line (live.progress_line)."""
        if self.bar is not None:
            if total != self.bar.total:
                self._set_total(total)
            self.bar.n, self.bar.run_rate = settled, rate or 0.0
            self.bar.set_postfix_str(line, refresh=True)
        elif self.mode == "log" and time.monotonic() - self._last_log >= LOG_INTERVAL:
            self._last_log = time.monotonic()
            log.info("progress: %s | %s", how_far(settled, total, rate, self.unit), line)

    def _set_total(self, total: int | None) -> None:
        self.bar.total = total
        widget = getattr(self.bar, "container", None)  # tqdm.notebook's: its bar's max is the total
        if widget is not None and total is not None:
            widget.children[1].max = total

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_bar(unit: str) -> Any:
    """tqdm.auto's bar (in a notebook, its widget; the text bar without ipywidgets) whose rate, and so its
    ETA, is the run's own: the units settled over the last minutes, not every unit counted since the start
    (a resume hands over the rows earlier runs settled in a rush)."""
    from tqdm.auto import tqdm

    class RunBar(tqdm):  # type: ignore[misc]
        run_rate = 0.0

        @property
        def format_dict(self) -> dict[str, Any]:
            return {**super().format_dict, "rate": self.run_rate}

    return RunBar(total=None, unit=unit, dynamic_ncols=True)


def how_far(settled: int, total: int | None, rate: float | None, unit: str) -> str:
    """ "1,200/5,000 rows (24%), ETA 5m 03s" (what the bar shows, for a log line)."""
    if total is None:
        return f"{settled:,} {unit}s, total not known"
    left = max(total - settled, 0)
    eta = duration(left / rate) if rate else "unknown"
    return f"{settled:,}/{total:,} {unit}s ({100 * settled / max(total, 1):.0f}%), ETA {eta}"


def duration(seconds: float) -> str:
    """Seconds as "1h 02m", "3m 04s" or "5 s"."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s} s"
