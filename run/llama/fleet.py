#!/usr/bin/env python3
"""Start and stop a local fleet of llama.cpp `llama-server` processes on 127.0.0.1.

    fleet.py start --model M.gguf --ports 31100-31101 --dir RUN_DIR [--parallel 16]
                   [--ctx-per-slot 2048] [--threads N] [--timeout 60] [--server PATH]
                   [-- EXTRA llama-server ARGS...]
    fleet.py stop   --dir RUN_DIR [--timeout 10]
    fleet.py status --dir RUN_DIR

`start` launches one llama-server per port (own session, stdin closed, output to
RUN_DIR/llama-<port>.log), writes RUN_DIR/llama-<port>.pid and RUN_DIR/fleet.json, then waits until
every server answers `GET /health` with 200. It prints one `127.0.0.1:<port>` per line on stdout and
exits 0. If a server exits early or is not healthy within --timeout, it names each one with the
tail of its log, stops every server it started, and exits 1. Ports already in use are refused.

`stop` sends SIGTERM (SIGKILL after --timeout) to exactly the pids recorded in RUN_DIR, after
checking that each pid is still the same process (same start time in /proc), so a recycled pid is
never signalled. It removes the pid files, is idempotent, and exits 0 when none is left running.

Per-request context: each of the --parallel slots gets --ctx-per-slot tokens
(`--kv-unified-per-slot`; the unified KV pool is sized to parallel * ctx-per-slot). That is what
`/v1/models` reports as `data[0].meta.n_ctx` and `/props` as `default_generation_settings.n_ctx`.

The binary defaults to $LLAMA_SERVER, else
${GEN_PIPELINE_CACHE:-~/.cache/gen-pipeline}/llama/bin/llama-server (built by run/llama/build.sh).
Standard library only; start_fleet() / stop_fleet() can be imported by pytest fixtures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

HOST = "127.0.0.1"
STATE_FILE = "fleet.json"

# Popen handles of servers started by this process, so they are reaped instead of left as zombies.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def default_server() -> str:
    if os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    cache = os.environ.get("GEN_PIPELINE_CACHE") or str(Path.home() / ".cache" / "gen-pipeline")
    return str(Path(cache) / "llama" / "bin" / "llama-server")


def parse_ports(spec: str) -> list[int]:
    """'31100-31103' or '31100,31102' (or a mix) -> sorted unique ports."""
    ports: set[int] = set()
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi < lo:
                raise ValueError(f"bad port range {part!r}")
            ports.update(range(lo, hi + 1))
        else:
            ports.add(int(part))
    if not ports or any(not 1 <= p <= 65535 for p in ports):
        raise ValueError(f"bad port list {spec!r}")
    return sorted(ports)


def _proc_start_time(pid: int) -> int | None:
    """Start time of pid (clock ticks since boot, /proc/<pid>/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # zombie or dead
        return None
    return int(fields[19])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def health(port: int, timeout: float = 2.0) -> int | None:
    """HTTP status of GET /health (200 ready, 503 loading), None if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in lines[-n:])


@dataclass
class Server:
    port: int
    pid: int
    start_time: int | None
    log: str
    pid_file: str
    cmd: list[str]

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def alive(self) -> bool:
        """True while the recorded process (same pid and start time) exists."""
        proc = _CHILDREN.get(self.pid)
        if proc is not None:
            proc.poll()  # reap our own child if it has exited
        st = _proc_start_time(self.pid)
        return st is not None and st == self.start_time


def _reap(pid: int) -> None:
    """Forget our child `pid`, collecting its exit status first. `alive()` reports a zombie as gone before
    it is reaped; dropping its Popen then leaves a zombie and a ResourceWarning when it is collected."""
    proc = _CHILDREN.pop(pid, None)
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _save_state(run_dir: Path, servers: list[Server]) -> None:
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps([asdict(s) for s in servers], indent=2) + "\n")
    tmp.replace(run_dir / STATE_FILE)


def load_state(run_dir: str | Path) -> list[Server]:
    path = Path(run_dir) / STATE_FILE
    if not path.exists():
        return []
    return [Server(**d) for d in json.loads(path.read_text())]


def start_fleet(
    model: str | Path,
    ports: list[int],
    run_dir: str | Path,
    *,
    parallel: int = 16,
    ctx_per_slot: int = 2048,
    threads: int | None = None,
    timeout: float = 60.0,
    server: str | None = None,
    extra_args: list[str] | None = None,
    log: Callable[[str], object] = print,
) -> list[Server]:
    """Start one llama-server per port and wait for /health 200.

    On failure every server started here is stopped and RuntimeError says which ports failed.
    """
    server = server or default_server()
    if not (os.path.isfile(server) and os.access(server, os.X_OK)):
        raise RuntimeError(f"llama-server not found or not executable: {server} (run build.sh)")
    if not Path(model).is_file():
        raise RuntimeError(f"model not found: {model} (make it with make_tiny_gguf.py)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if any(s.alive() for s in load_state(run_dir)):
        raise RuntimeError(f"{run_dir} has running servers; run `fleet.py stop --dir {run_dir}`")
    busy = [p for p in ports if not _port_free(p)]
    if busy:
        raise RuntimeError(f"port(s) already in use on {HOST}: {', '.join(map(str, busy))}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // len(ports))

    servers: list[Server] = []
    try:
        for port in ports:
            log_path = run_dir / f"llama-{port}.log"
            pid_path = run_dir / f"llama-{port}.pid"
            cmd = [
                server, "-m", str(model), "--host", HOST, "--port", str(port),
                "-np", str(parallel), "--kv-unified-per-slot", str(ctx_per_slot),
                "-t", str(threads), *(extra_args or []),
            ]  # fmt: skip
            with open(log_path, "wb") as logf:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            _CHILDREN[proc.pid] = proc
            pid_path.write_text(f"{proc.pid}\n")
            start = _proc_start_time(proc.pid)
            servers.append(Server(port, proc.pid, start, str(log_path), str(pid_path), cmd))
            _save_state(run_dir, servers)

        deadline = time.monotonic() + timeout
        pending = {s.port: s for s in servers}
        failed: dict[int, str] = {}
        while pending and time.monotonic() < deadline:
            for port, s in list(pending.items()):
                if not s.alive():
                    rc = _CHILDREN[s.pid].returncode if s.pid in _CHILDREN else None
                    failed[port] = f"exited (status {rc})"
                    del pending[port]
                elif health(port) == 200:
                    del pending[port]
            if pending:
                time.sleep(0.2)
        for port in pending:
            failed[port] = f"no /health 200 within {timeout:g}s (last status {health(port)})"
        if failed:
            report = [f"{len(failed)} of {len(servers)} llama-server(s) did not become healthy:"]
            for port, why in sorted(failed.items()):
                log_path = run_dir / f"llama-{port}.log"
                report.append(f"  {HOST}:{port}: {why}; end of {log_path}:")
                report.append(_log_tail(log_path))
            raise RuntimeError("\n".join(report))
    except BaseException:
        stop_fleet(run_dir, log=lambda _msg: None)
        raise
    addresses = ", ".join(s.address for s in servers)
    log(f"{len(servers)} llama-server(s) healthy: {addresses} (dir {run_dir})")
    return servers


def stop_fleet(run_dir: str | Path, *, timeout: float = 10.0, log: Callable[[str], object] = print) -> bool:
    """Stop exactly the servers recorded in run_dir. True when none of them is left running."""
    run_dir = Path(run_dir)
    servers = load_state(run_dir)
    # pid files missing from fleet.json (crash between writes) count if the pid is a llama-server
    known = {s.pid for s in servers}
    for pid_file in sorted(run_dir.glob("llama-*.pid")):
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid not in known:
            try:
                exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                exe = b""
            start = _proc_start_time(pid) if exe.endswith(b"llama-server") else None
            servers.append(Server(0, pid, start, "", str(pid_file), []))

    live = [s for s in servers if s.alive()]
    for s in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(s.pid, signal.SIGTERM)
    killed = []
    for sig_deadline, sig in ((timeout, signal.SIGKILL), (5.0, None)):
        deadline = time.monotonic() + sig_deadline
        while time.monotonic() < deadline and any(s.alive() for s in live):
            time.sleep(0.1)
        if sig is not None:
            for s in live:
                if s.alive():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(s.pid, sig)
                        killed.append(s.pid)
    left = [s for s in live if s.alive()]
    for s in servers:
        if s not in left:
            Path(s.pid_file).unlink(missing_ok=True)
            _reap(s.pid)
    if not left:
        (run_dir / STATE_FILE).unlink(missing_ok=True)
    msg = f"stopped {len(live) - len(left)} llama-server(s) in {run_dir}"
    if killed:
        msg += f" (SIGKILL needed for pids {' '.join(map(str, killed))})"
    log(msg)
    if left:
        log(f"STILL RUNNING: pids {' '.join(str(s.pid) for s in left)}")
    return not left


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("start", help="start servers and wait until healthy")
    st.add_argument("--model", required=True, help="GGUF model path")
    st.add_argument("--ports", required=True, help="e.g. 31100-31103 or 31100,31105")
    st.add_argument("--dir", required=True, help="folder for pid files, logs and fleet.json")
    st.add_argument("--parallel", type=int, default=16, help="slots per server (default 16)")
    st.add_argument("--ctx-per-slot", type=int, default=2048, help="tokens per slot (default 2048)")
    st.add_argument("--threads", type=int, help="threads per server (default cpus // servers)")
    st.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    st.add_argument("--server", help="llama-server binary (default $LLAMA_SERVER or build cache)")
    sp = sub.add_parser("stop", help="stop the servers recorded in --dir")
    sp.add_argument("--dir", required=True)
    sp.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL")
    ss = sub.add_parser("status", help="show the servers recorded in --dir")
    ss.add_argument("--dir", required=True)
    args = ap.parse_args(argv)

    def err(msg: str) -> None:
        print(f"fleet.py: {msg}", file=sys.stderr)

    if args.cmd == "start":
        try:
            servers = start_fleet(
                args.model,
                parse_ports(args.ports),
                args.dir,
                parallel=args.parallel,
                ctx_per_slot=args.ctx_per_slot,
                threads=args.threads,
                timeout=args.timeout,
                server=args.server,
                extra_args=extra,
                log=err,
            )
        except (RuntimeError, ValueError) as e:
            err(str(e))
            return 1
        for s in servers:
            print(s.address)
        return 0
    if args.cmd == "stop":
        return 0 if stop_fleet(args.dir, timeout=args.timeout, log=err) else 1
    servers = load_state(args.dir)
    states = {True: "healthy", False: "running, not healthy"}
    for s in servers:
        state = states[health(s.port) == 200] if s.alive() else "not running"
        print(f"{s.address} pid {s.pid}: {state} (log {s.log})")
    return 0 if servers and all(s.alive() for s in servers) else 1


if __name__ == "__main__":
    sys.exit(main())
