"""Stops are never lost: stop signals behind a closed stream, during start-up, and through run/nightly.sh.

Real processes: `generate` whose stdout and stderr lead nowhere still stops on SIGTERM with exit 130 and
a summary; a signal before the run loop exits 130 with one line; the nightly wrapper passes the stop on.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest
from e2e import check_invariant, prompts
from procs import (
    PY,
    alive,
    env,
    generate_argv,
    kill_all,
    run_generate,
    sim_fleet,
    wait_for_done,
    wait_for_lines,
    wait_gone,
)
from test_nightly import NIGHTLY, clean_env, source_rows
from test_nightly import write_jsonl as write_rows

from gen_pipeline.sim import free_ports

REPO = Path(__file__).resolve().parents[1]
WAITING = "waiting for servers to come up"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "two workers"])
def test_sigterm_behind_a_closed_pipe_stops_with_a_summary(write_jsonl, tmp_path, workers):
    """stdout and stderr closed by their reader (a killed `tee`): SIGTERM still stops the run, exit 130,
    summary.json written; the resume then ends with every id exactly once."""
    rows = prompts(800)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.01") as servers:
        argv = generate_argv(path, out, servers, "--concurrency", "2", *workers)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
        try:
            wait_for_done(out, 10, 60)
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["exit_code"] == 130 and summary["stop_reason"] == "interrupted by SIGTERM"
        again = run_generate(path, out, servers, *workers)
    assert again.returncode == 0, again.stderr
    assert check_invariant([r["id"] for r in rows], out) == {"done": 800, "ledger": 0}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "two workers"])
def test_a_stop_signal_during_start_up_exits_130_in_one_line(write_jsonl, tmp_path, sig, workers):
    """While discovery still waits for the fleet, SIGTERM, SIGHUP and SIGINT alike exit 130 with one line
    on stderr and no traceback."""
    path, out = write_jsonl(prompts(5)), tmp_path / "out"
    servers = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens: a fleet still starting
    argv = generate_argv(path, out, servers, "--startup-timeout", "120", *workers, progress="off")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert WAITING in first, first
        proc.send_signal(sig)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    said = [line for line in rest.splitlines() if WAITING not in line]
    assert proc.returncode == 130, rest
    assert len(said) == 1 and sig.name in said[0] and "Traceback" not in rest, rest


# The run's third-party dependencies (pyproject.toml), by import name: importing them takes most of
# start-up (0.6-1 s), and `generate` must own the stop signals before the first of them.
HEAVY = {"aiohttp", "datasets", "jinja2", "numpy", "orjson", "tenacity", "tokenizers", "tqdm", "transformers"}
ENTRIES = {"python -m": [PY, "-m", "gen_pipeline"], "console script": [str(Path(PY).with_name("gen-pipeline"))]}


def stale_console_script() -> str | None:
    """Why the installed `gen-pipeline` script is not the one pyproject.toml declares (an install older
    than the entry point: `make install` redoes it), or None."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["gen-pipeline"]
    module, _, func = declared.partition(":")
    script = Path(ENTRIES["console script"][0])
    if not script.exists() or f"from {module} import {func}" not in script.read_text():
        return f"{script} does not run {declared} (installed before it was declared): reinstall"
    return None


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_in_the_first_imports_exits_130(tmp_path, entry, sig):
    """A stop signal sent the moment `generate` has imported its first dependency (the process reports
    each import as it ends: -X importtime) exits 130 with one line, three times out of three."""
    if entry == "console script" and (stale := stale_console_script()):
        pytest.skip(stale)
    argv = [*ENTRIES[entry], "generate", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out")]
    for _ in range(3):
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**env(), "PYTHONPROFILEIMPORTTIME": "1"})
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.rpartition("|")[2].strip().split(".")[0] in HEAVY:
                    break
            proc.send_signal(sig)
            _, rest = proc.communicate(timeout=60)
        finally:
            kill_all([proc.pid] if proc.poll() is None else [])
        said = [line for line in rest.splitlines() if not line.startswith("import time:")]
        assert proc.returncode == 130, said
        assert len(said) == 1 and sig.name in said[0], said


def test_a_stop_signal_after_generate_has_returned_is_ignored_and_its_code_stands(tmp_path):
    """A signal once the entry point's `generate` has returned (the run written, the summary printed, the
    interpreter ending) is ignored and the command's own exit code stands: the interpreter's shutdown puts
    Python handlers back to the default, and a SIGTERM there killed a finished run (exit 143, seen 20-50 ms
    after the last line of a 600-row run); a default SIGINT raised KeyboardInterrupt out of the shutdown."""
    script = (
        "import os, signal, sys, time\n"
        "from gen_pipeline.__main__ import main\n"
        f"sys.argv = ['gen-pipeline', 'generate', '-i', {str(tmp_path / 'none.jsonl')!r}, '-o', {str(tmp_path)!r}]\n"
        "code = main()\n"
        "assert code == 1, code\n"
        "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
        "    os.kill(os.getpid(), sig)\n"
        "time.sleep(0.2)\n"
        "class Late:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n"
        "late = Late()\n"  # freed in the interpreter's shutdown, after handlers are put back
        "sys.exit(code)\n"
    )
    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, env=env(), timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "SIGINT" not in done.stderr and "SIGTERM" not in done.stderr


def session_members(sid: int) -> list[int]:
    """Every process in session `sid` (what systemd's stop signals in a unit's group, near enough)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            members.append(int(stat.parent.name))
    return members


@pytest.mark.slow
@pytest.mark.parametrize("whom", ["the wrapper", "the whole unit"])
def test_nightly_passes_sigterm_on_and_logs_the_summary(tmp_path, whom):
    """SIGTERM to run/nightly.sh (or to every process of it, as `systemctl stop` does) stops generate,
    which writes its summary into the night's log; the wrapper exits 130 and marks nothing done."""
    ds, src = tmp_path / "ds", tmp_path / "source.jsonl"
    write_rows(src, source_rows([f"Question {i}: tell me about topic {i}" for i in range(600)]))
    with sim_fleet(2, "--token-latency", "0.01") as servers:
        night = ["--dataset-dir", ds, "--date", "2026-01-01", "--", "--concurrency", "2", "--progress", "off"]
        wrapper = subprocess.Popen(
            ["bash", str(NIGHTLY), *map(str, night)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers, GEN_PIPELINE=f"{PY} -m gen_pipeline"),
            start_new_session=True,
        )
        members: list[int] = []
        try:
            wait_for_lines(ds / "completions.jsonl", 10, 90)
            members = session_members(wrapper.pid)
            for pid in members if whom == "the whole unit" else [wrapper.pid]:
                os.kill(pid, signal.SIGTERM)
            assert wrapper.wait(timeout=60) == 130
            assert wait_gone(members, 30) == []
        finally:
            kill_all([p for p in members if alive(p)])
            if wrapper.poll() is None:
                wrapper.kill()
                wrapper.wait()
    log = (ds / "logs" / "nightly-2026-01-01.log").read_text()
    assert "stopped: interrupted by SIGTERM" in log and "completed " in log, log
    assert "exit 130" in log
    assert not list((ds / "prompts").glob("*.done"))
