"""How a process runs and stops: tuning done once before threads start (malloc arenas, the cycle
collector, the open-file limit), stop signals, and standard streams that never raise.

`generate` owns SIGINT, SIGTERM and SIGHUP from its first line: until the run loop takes them over
(install_run_handlers) and again after it, one of them prints one line and exits 130 at once. Nothing
is lost by that: before the loop nothing has been sent, after it the summary is written, and anything
between is what kill -9 would leave (torn tails are repaired on resume). Once the command has returned
they are ignored (ignore_stop_signals): the interpreter's shutdown would put the default back.

A stop must never be lost to a closed stream (the `tee` of a wrapper killed with the unit's group, a
terminal gone): `QuietStream` swallows a failed write and points the descriptor at /dev/null, so every
later write, and the interpreter's last flush, succeed silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
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


def ignore_stop_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP ignored from now on (kept so through the interpreter's shutdown, which puts
    Python handlers back to the default)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


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
    import asyncio  # here: the entry point installs the other handlers before asyncio is imported

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


# prctl's option that has the kernel signal this process when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1


def die_with(supervisor: int) -> bool:
    """Be killed when the process `supervisor` (our parent) dies, and exit now if it already has.

    A wrapper (run/nightly.sh) starts its child with a parent-death signal so that a kill -9 of the wrapper
    never leaves the child running unsupervised. Set before exec (setpriv), that signal is lost when the
    wrapper dies between the fork and the setting; checking the parent after setting it closes that gap.
    True when the signal is set (Linux), False where the platform has none."""
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            armed = ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if os.getppid() != supervisor:
        say(f"gen-pipeline: the process that started this one ({supervisor}) is gone; stopping")
        os._exit(EXIT_INTERRUPTED)
    return armed


# glibc gives each thread that allocates its own malloc arena; the tokenizer thread and the Rust encode
# threads fragment theirs under long prompts (RSS +90 MB over a 654k-row run). Two arenas keep it flat.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas for this process (before threads start); True when applied. A user's
    MALLOC_ARENA_MAX wins; other C libraries are left alone."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, MALLOC_ARENAS))
    except (OSError, AttributeError):
        return False


def raise_open_file_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit (each request in flight holds a
    socket; distributions often start at 1,024); the new soft limit, or None where there is none to raise."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        return hard
    return soft if soft != resource.RLIM_INFINITY else None


# CPython walks its youngest generation of containers every 700 net allocations. A run keeps thousands of
# parsed prompts queued and in flight, so each walk meets the same live objects again: 0.3-0.4 s of CPU
# per 20,000 requests (~4%), for cycles that almost never form here. One walk per 10,000 allocations costs
# 0.03 s over the same run (49 walks, median 0.2 ms, longest 5-6 ms as before); memory is still freed by
# reference counting.
GC_YOUNG_THRESHOLD = 10_000


def collect_cycles_less_often() -> None:
    """Raise the youngest generation's collection threshold (the older two keep their defaults)."""
    young, older, oldest = gc.get_threshold()
    if 0 < young < GC_YOUNG_THRESHOLD:  # 0: the user turned collection off; keep it so
        gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def open_file_limit() -> int:
    """This process's soft limit on open files (sockets included); very large where there is none."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return 1 << 20
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def tune_process() -> None:
    """What every command does once, before any thread starts: fewer malloc arenas, fewer cycle collections,
    the open-file limit raised, and a file-size limit (ulimit -f) that fails a write with EFBIG (which we
    report and survive) instead of killing the process mid-line."""
    limit_malloc_arenas()
    collect_cycles_less_often()
    raise_open_file_limit()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
