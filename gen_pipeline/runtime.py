"""How a process stops: stop signals outside the run loop, and standard streams that never raise.

`generate` owns SIGINT, SIGTERM and SIGHUP from its first line: until the run loop takes them over
(install_run_handlers) and again after it, one of them prints one line and exits 130 at once. Nothing
is lost by that: before the loop nothing has been sent, after it the summary is written, and anything
between is what kill -9 would leave (torn tails are repaired on resume).

A stop must never be lost to a closed stream (the `tee` of a wrapper killed with the unit's group, a
terminal gone): `QuietStream` swallows a failed write and points the descriptor at /dev/null, so every
later write, and the interpreter's last flush, succeed silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .errors import EXIT_INTERRUPTED

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
Handler = Callable[[int, Any], Any] | int | signal.Handlers | None


def silence(stream: TextIO) -> None:
    """Point a broken stream's descriptor at /dev/null, so that nothing written to it fails any more."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # also io.UnsupportedOperation
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def say(text: str, stream: TextIO | None = None) -> None:
    """Print one line to stderr (or `stream`); a closed stream is silenced, never raised from."""
    out = sys.stderr if stream is None else stream
    try:
        print(text, file=out, flush=True)
    except (OSError, ValueError):
        silence(out)


class QuietStream:
    """A text stream whose writes never raise: after the first failure it writes to /dev/null."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except (OSError, ValueError):
                self._break()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._break()

    def _break(self) -> None:
        self.broken = True
        silence(self.stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def quiet_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr never raise inside the block (the originals come back after it)."""
    before = sys.stdout, sys.stderr
    quiet = QuietStream(before[0]), QuietStream(before[1])
    sys.stdout, sys.stderr = quiet
    try:
        yield
    finally:
        for stream in quiet:  # now, so that the interpreter's last flush finds nothing to fail on
            stream.flush()
        sys.stdout, sys.stderr = before


def _exit_at_once(signum: int, _frame: Any) -> None:
    say(f"{signal.Signals(signum).name}: stopped; the output stays resumable (run the same command again)")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)


def install_stop_handlers() -> dict[int, Handler]:
    """SIGINT, SIGTERM and SIGHUP exit 130 with one line from now on; the handlers they replace."""
    return {sig: signal.signal(sig, _exit_at_once) for sig in STOP_SIGNALS}


def restore_handlers(previous: dict[int, Handler]) -> None:
    """Put back the handlers `install_stop_handlers` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def install_run_handlers(
    request_stop: Callable[[str], None], sync: Callable[[], None], grace_period: float
) -> Callable[[], None]:
    """While the run loop runs: SIGINT, SIGTERM and SIGHUP stop the run first, then say so (a closed stream
    cannot lose the stop); a second Ctrl-C syncs the output and exits at once. Returns what puts the
    handlers from before back."""
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    seen: list[str] = []

    def on_signal(signame: str) -> None:
        seen.append(signame)
        if len(seen) > 1:
            if signame != "SIGINT":
                return  # the same stop again: systemd signals the unit's group, and a wrapper passes it on too
            with contextlib.suppress(Exception):
                sync()
            os._exit(EXIT_INTERRUPTED)
        request_stop(f"interrupted by {signame}")
        say(
            f"\n{signame}: stopping; in-flight requests get {grace_period:.0f} s "
            "(press Ctrl-C again to exit now; the output stays resumable)"
        )

    def restore() -> None:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    return restore
