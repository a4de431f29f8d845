"""`generate --workers K`: K claimer processes on this node, supervised by the one the user started.

The parent holds the run directory's shared lock, settles the manifest (V, the number of shards, is
recorded there) and repairs torn tails, then starts `gen-pipeline generate ... --join --share K
--parent-fd N` K times. Each worker is a claimer (run.py): it claims open shards of the run and
writes shards/SSSSS/, and takes 1/K of each server's capacity. When they have all ended, the parent
adds up their summaries into summary.json. A run may be resumed with any K, or by claimers on other
nodes. Signals go to the parent, which passes them on once (the workers run in their own process
groups, so Ctrl-C is not delivered twice).

Workers die with their parent: on Linux the kernel kills them when it dies (PR_SET_PDEATHSIG), and
everywhere each watches the read end of a pipe whose write end only the parent holds; end of file
means the parent is gone, and the worker exits at once, before it claims anything if it finds it gone
on start. The API key reaches the workers in their environment, never on their command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import orjson

from ..config import API_KEY_ENV, SERVER_AUTH_ENV, RunConfig
from ..engine import metrics
from ..engine.summary import Outcome, merge_summaries
from ..errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTAGE, EXIT_OUTPUT, OutputError
from ..http import Client, open_transport
from ..inputs.kinds import check_input
from ..rundir.layout import RunDir, made_for_run, write_json_atomic
from ..rundir.locks import refuse_shard_writers
from ..rundir.store import repair_all
from ..runtime import STOP_SIGNALS, say
from .claims import SharedRunLock
from .run import claimer_summaries, shard_table, with_shards

# The exit code of the whole run is the most serious of the workers'.
SEVERITY = [EXIT_ERROR, EXIT_OUTPUT, EXIT_OUTAGE, EXIT_INTERRUPTED, EXIT_INCOMPLETE, EXIT_OK]
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def worker_argv(
    argv: list[str], index: int, count: int, parent_fd: int, servers: tuple[str, ...] | None = None
) -> list[str]:
    """The command line of worker `index`: the user's without the API key and with `servers` (their names,
    without user:password@) as --servers, as a claimer beside the others taking 1/count of each server, the
    pipe that tells it its parent is alive, and no progress display."""
    shard = ["--join", "--share", str(count), "--parent-fd", str(parent_fd)]
    argv = without_api_key(argv) if servers is None else named_servers(without_api_key(argv), servers)
    return [sys.executable, "-m", "gen_pipeline", *argv, *shard, "--progress", "off"]


def named_servers(argv: list[str], servers: tuple[str, ...]) -> list[str]:
    """argv with every --servers / -s value (however spelled) replaced by `servers`."""
    value = ",".join(servers)
    out, take = [], False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if take:
            arg, take = value, False
        elif name == "-s" or (len(name) > 3 and "--servers".startswith(name)):
            arg, take = (f"{name}={value}", False) if eq else (arg, True)
        elif arg.startswith("-s") and not arg.startswith("--"):  # -sVALUE
            arg = f"-s{value}"
        out.append(arg)
    return out


def without_api_key(argv: list[str]) -> list[str]:
    """argv without `--api-key KEY` / `--api-key=KEY` (argparse also takes a prefix such as `--api`)."""
    out, skip = [], False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if skip:
            skip = False
        elif len(name) > 2 and "--api-key".startswith(name):
            skip = not eq
        else:
            out.append(arg)
    return out


def worker_env(config: RunConfig) -> dict[str, str]:
    """The workers' environment: ours, the API key and the --servers URLs' credentials (`ps` shows command
    lines to every user)."""
    env = dict(os.environ)
    if config.api_key:
        env[API_KEY_ENV] = config.api_key
    if config.server_auth:
        env[SERVER_AUTH_ENV] = orjson.dumps(config.server_auth).decode()
    return env


def merged_exit_code(codes: list[int]) -> int:
    """The most serious exit code; a worker killed by a signal counts as interrupted."""
    known = [c if c >= 0 else EXIT_INTERRUPTED for c in codes]
    return next((c for c in SEVERITY if c in known), EXIT_ERROR)


def killed_elsewhere(config: RunConfig, codes: list[int]) -> list[int]:
    """The codes of claimers killed by a signal we did not pass on (the OOM killer, a kill -9): not an
    interrupt of the run. Its claims died with it and the others took its shards over: the run is whole
    when every shard is settled (0), else incomplete (3: run again)."""
    if all(c >= 0 for c in codes):
        return codes
    left = shard_table(config).open_shards()
    return [c if c >= 0 else EXIT_INCOMPLETE if left else EXIT_OK for c in codes]


async def _settle(config: RunConfig) -> None:
    from ..engine.setup import settle_settings

    async with open_transport(config.api_key, auth=config.server_auth) as transport:
        await settle_settings(config, Client(transport))


def run_workers(config: RunConfig, argv: list[str]) -> Outcome:
    """Run `config.workers` worker processes over the input and merge what they report."""
    check_input(config.input)
    with made_for_run(config.out):
        config = with_shards(config)  # the workers are claimers of the run's shards (claims.py)
        lock = SharedRunLock(config.out, config.join)
        lock.acquire()
        try:
            refuse_shard_writers(config.out)  # a static worker of an earlier version still writing here
            asyncio.run(_settle(config))  # refuse a changed manifest before any worker starts; record V
            repair_all(config.out)
            return _supervise(config, argv)
        finally:
            lock.release()


def _supervise(config: RunConfig, argv: list[str]) -> Outcome:
    k, start, started = config.workers, time.monotonic(), time.time()
    for stale in RunDir(config.out).stale_worker_reports():
        stale.unlink()  # a worker that dies early must not be reported with an old run's figures
    # Only we hold the write end (os.pipe is close-on-exec): the workers see end of file when we die.
    # Started from the main thread: the parent-death signal follows the thread that started a child.
    alive_r, alive_w = os.pipe()
    try:
        procs = [_start_worker(config, argv, i, alive_r) for i in range(k)]
    finally:
        os.close(alive_r)

    stopped: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    try:
        codes = [p.wait() for p in procs]
        judged = codes if stopped else killed_elsewhere(config, codes)
        return _merge(config, codes, merged_exit_code(judged), time.monotonic() - start, started)
    finally:  # after summary.json: a signal meanwhile is passed on (to no one) rather than lose it
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.close(alive_w)


def _start_worker(config: RunConfig, argv: list[str], index: int, alive_r: int) -> subprocess.Popen[bytes]:
    argv = [*worker_argv(argv, index, config.workers, alive_r, config.servers), *metrics.worker_args(config, index)]
    if index:  # every claimer sees a stall of the fleet they share: one of them runs --on-stall, once per stall
        argv += ["--on-stall", ""]
    env = worker_env(config)
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, pass_fds=(alive_r,), start_new_session=True)


def _merge(config: RunConfig, codes: list[int], exit_code: int, elapsed: float, started: float) -> Outcome:
    """summary.json from the summaries of the claimers this run started (`codes`: theirs); the run's outcome."""
    parts = claimer_summaries(RunDir(config.out), since=started)
    summary = merge_summaries(parts, elapsed, exit_code)
    summary["claimers"] = summary["workers"]
    if len(parts) < len(codes):  # one died before its summary: its error is on stderr above
        lost = [f"worker {i} (exit {c})" for i, c in enumerate(codes) if c != EXIT_OK] or ["a worker"]
        summary["warnings"].append(f"no summary from {', '.join(lost)}; see the errors above")
    try:
        write_json_atomic(RunDir(config.out).writer().summary, summary)
    except OutputError as exc:
        summary["warnings"].append(str(exc))
        # a worker that could not write said why on stderr; else this is the cause
        error = None if exit_code == EXIT_OUTPUT else str(exc)
        return Outcome(summary, merged_exit_code([exit_code, EXIT_OUTPUT]), error)
    return Outcome(summary, exit_code)


def follow_parent(fd: int) -> None:
    """Die with the parent: the kernel's parent-death signal where there is one, and a thread that exits
    the process as soon as the parent's pipe closes."""
    die_with_parent()
    if parent_gone(fd):  # it died before the signal was armed
        _orphaned()
    threading.Thread(target=_wait_for_eof, args=(fd,), name="gen-pipeline-parent", daemon=True).start()


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; True when armed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def parent_gone(fd: int) -> bool:
    """The parent never writes to the pipe, so a readable read end means end of file: it is gone."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _wait_for_eof(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 64):
            pass
    _orphaned()


def _orphaned() -> None:
    """Exit at once: what was written stays valid (a torn last line is repaired by the next run)."""
    say("worker: the parent process is gone; stopping now (run the same command again to resume)")
    os._exit(EXIT_INTERRUPTED)
