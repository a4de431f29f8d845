"""The command line as users run it: exit codes, errors, kill -9 and Ctrl-C, then resume."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import sys
import time

import orjson
import pytest
from e2e import check_invariant, prompts, read_jsonl
from procs import generate, run_generate, sim_fleet, wait_for_lines

from gen_pipeline.cli import build_parser, main


def test_help_lists_the_commands_and_exit_codes(capsys):
    """--help names the subcommands and documents every exit code."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for word in ("generate", "simulate", "130", "resumable"):
        assert word in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["generate", "--input", "nope.jsonl", "--out", "o", "--servers", "127.0.0.1:1"],
            "input file not found",
        ),
        (["generate", "--input", ".", "--out", "o", "--servers", "127.0.0.1:1"], ". is a directory: --input takes"),
        (["generate", "--input", ".", "--out", "o", "--servers", "127.0.0.1:1", "--workers", "2"], "is a directory"),
        (["check", "--input", ".", "--servers", "127.0.0.1:1"], "is a directory"),
        (["check", "--input", "nope.jsonl", "--servers", "127.0.0.1:1"], "input file not found"),
        (["generate", "--input", "x", "--out", "o", "--servers", "bad server"], "bad server"),
        (["generate", "--input", "x", "--out", "o", "--max-tokens", "0"], "--max-tokens"),
        (
            ["generate", "--input", "x", "--out", "o", "--retry-failed", "typo"],
            "unknown ledger reason",
        ),
        (["generate", "--input", "x", "--out", "o", "--sampling", "{"], "--sampling"),
    ],
)
def test_user_errors_are_one_line_and_exit_1(argv, message, capsys, tmp_path, monkeypatch):
    """A user error prints one 'error:' line and exits 1, with no traceback."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("flag", [["--shard", "0/2"], ["--shard=1/4"], ["--shard"]])
def test_the_static_shard_flag_of_earlier_versions_is_refused_in_one_line(flag, capsys, tmp_path):
    """`generate --shard i/K` started a static worker of an earlier version: it exits 2 with one line saying
    what to use now (argparse took it for an abbreviation of --shards: "invalid int value: '0/2'")."""
    with pytest.raises(SystemExit) as stopped:
        main(["generate", "--input", "x", "--out", str(tmp_path / "o"), *flag])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: --shard") and "--workers K" in err and "--shards V" in err
    assert not (tmp_path / "o").exists()


def test_unreachable_fleet_exits_1(write_jsonl, tmp_path, capsys, caplog):
    """No server answering within --startup-timeout is a clear error, saying why the first one did not; the
    wait is said once, with that reason, not once a second (120 identical lines, no reason, before)."""
    import logging

    caplog.set_level(logging.INFO)
    path = write_jsonl(prompts(2))
    code = main(
        [
            "generate",
            "--input",
            str(path),
            "--out",
            str(tmp_path / "o"),
            "--servers",
            "127.0.0.1:1",
            "--startup-timeout",
            "2.5",
            "--progress",
            "off",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "no server answered within 2 s: http://127.0.0.1:1 (http://127.0.0.1:1: " in err, err
    waits = [r.getMessage() for r in caplog.records if "waiting for servers" in r.getMessage()]
    assert len(waits) == 1 and "1 down (http://127.0.0.1:1: " in waits[0], waits


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_gives_exactly_one_line_per_id(write_jsonl, tmp_path):
    """SIGKILL at random moments loses no finished line and duplicates none; resume completes."""
    rows = prompts(400)
    path, out = write_jsonl(rows), tmp_path / "out"
    rng = random.Random(2)
    kills = 0
    with sim_fleet(4, "--token-latency", "0.004", "--seed", "1") as servers:
        for _ in range(3):
            proc = generate(path, out, servers, "--concurrency", "8")
            wait_for_lines(out / "completions.jsonl", 40 * (kills + 1), 60)
            time.sleep(rng.random() * 0.3)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            kills += 1
        final = generate(path, out, servers, "--concurrency", "8")
        _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr
    assert check_invariant([r["id"] for r in rows], out) == {"done": 400, "ledger": 0}


@pytest.mark.slow
def test_ctrl_c_exits_130_resumable_then_completes(write_jsonl, tmp_path):
    """The first SIGINT drains and exits 130 with a resume hint; the rerun finishes the job."""
    rows = prompts(300)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2, "--token-latency", "0.005") as servers:
        proc = generate(path, out, servers, "--concurrency", "4")
        wait_for_lines(out / "completions.jsonl", 20, 60)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        assert "to resume, run the same command again" in stdout
        partial = len(read_jsonl(out / "completions.jsonl"))
        assert 20 <= partial < 300
        again = run_generate(path, out, servers, timeout=120)
    assert again.returncode == 0, again.stderr
    assert check_invariant([r["id"] for r in rows], out) == {"done": 300, "ledger": 0}


ARENA_PROBE = """
import ctypes, sys, tempfile, threading
from gen_pipeline.runtime import limit_malloc_arenas
applied = limit_malloc_arenas() if sys.argv[1] == "limit" else False
def churn():
    keep = [bytearray(40_000) for _ in range(200)]  # under the mmap threshold: from this thread's arena
    del keep
threads = [threading.Thread(target=churn) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
print(applied, open(path).read().count("<heap nr="))
"""


def _heaps(mode: str, **env: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", ARENA_PROBE, mode], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    applied, heaps = done.stdout.split()
    return applied, int(heaps)


def test_malloc_arenas_are_capped_unless_the_user_sets_them():
    """16 threads allocating get their own glibc arenas, unless the cap is applied; MALLOC_ARENA_MAX wins."""
    from gen_pipeline.runtime import MALLOC_ARENAS

    try:
        ctypes.CDLL("libc.so.6").malloc_info  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("not glibc")
    _, free = _heaps("none")
    if free <= MALLOC_ARENAS:
        pytest.skip(f"this machine made only {free} arenas without a cap: nothing to tell apart")
    applied, capped = _heaps("limit")
    assert applied == "True" and capped <= MALLOC_ARENAS < free
    applied, _ = _heaps("limit", MALLOC_ARENA_MAX="8")
    assert applied == "False"


def test_generate_does_not_import_the_simulator():
    """`generate` parses its flags, loads its request path and opens its transport without importing the
    simulator (0.1-0.4 s of start-up, paid again by every --workers process)."""
    import subprocess
    import sys

    code = (
        "import asyncio, sys\n"
        "from gen_pipeline.cli import _command, build_parser\n"
        "from gen_pipeline.http import open_transport\n"
        "import gen_pipeline.modes, gen_pipeline.engine.runner, gen_pipeline.shards.workers\n"
        "build_parser(_command(['generate', '-i', 'x', '-o', 'y'])).parse_args(['generate', '-i', 'x', '-o', 'y'])\n"
        "async def aio():\n    async with open_transport(None):\n        pass\n"
        "asyncio.run(aio())\n"
        "print('gen_pipeline.sim' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "False"


def test_open_file_limit_is_raised_to_the_hard_limit():
    """Distributions often start processes at 1,024 open files; the command raises its own soft limit."""
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "from gen_pipeline.runtime import raise_open_file_limit\n"
        "raised = raise_open_file_limit()\n"
        "print(raised, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    raised, now, hard = out
    assert now == hard and raised in (hard, "None")  # None: an unlimited hard limit is left as it is


def test_the_command_collects_cycles_less_often_unless_collection_is_off():
    """Every subcommand raises the youngest generation's threshold; a threshold of 0 (off) stays off."""
    code = (
        "import gc, sys\n"
        "gc.set_threshold(int(sys.argv[1]), 10, 10)\n"
        "from gen_pipeline import cli\n"
        "try:\n    cli.main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print(*gc.get_threshold())\n"
    )
    for before, after in (("700", "10000 10 10"), ("0", "0 10 10"), ("50000", "50000 10 10")):
        out = subprocess.run([sys.executable, "-c", code, before], capture_output=True, text=True, check=True)
        assert out.stdout.strip().splitlines()[-1] == after


@pytest.mark.slow  # an end-to-end run of several seconds; make test-fast leaves it out
def test_a_fleet_larger_than_the_open_file_limit_runs_without_connection_failures(write_jsonl, tmp_path):
    """8 servers x 128 slots with a hard limit of 512 files: in flight is capped (warning), nothing fails."""
    import resource

    def cap_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))

    rows = prompts(1500)
    path, out = write_jsonl(rows), tmp_path / "out"
    # a KV pool that admits all 128 (its default, 8 contexts, would cap each server's capacity below that)
    with sim_fleet(8, "--max-running", "128", "--max-total-tokens", str(128 * 8192)) as servers:
        done = run_generate(path, out, servers, preexec_fn=cap_files)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["completed"] == 1500 and summary["failed"] == {}
    assert all(not v["failures"] for v in summary["servers"].values()), summary["servers"]
    assert any("open-file limit (ulimit -n) is 512" in w for w in summary["warnings"])


@pytest.mark.parametrize(("value", "expected"), [(None, "auto"), ("", "auto"), ("transformers", "transformers")])
def test_the_tokenizer_loader_variable_is_read_by_the_cli_only(value, expected, monkeypatch, tmp_path):
    """GEN_PIPELINE_TOKENIZER_LOADER reaches the run as RunConfig.tokenizer_loader; a bad value is refused."""
    from gen_pipeline.cli import config_from_args
    from gen_pipeline.errors import ConfigError

    if value is None:
        monkeypatch.delenv("GEN_PIPELINE_TOKENIZER_LOADER", raising=False)
    else:
        monkeypatch.setenv("GEN_PIPELINE_TOKENIZER_LOADER", value)
    args = build_parser("generate").parse_args(["generate", "-i", str(tmp_path / "in"), "-o", str(tmp_path / "o")])
    assert config_from_args(args).tokenizer_loader == expected
    monkeypatch.setenv("GEN_PIPELINE_TOKENIZER_LOADER", "fast")
    with pytest.raises(ConfigError, match="GEN_PIPELINE_TOKENIZER_LOADER"):
        config_from_args(args)
