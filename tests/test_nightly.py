"""Tests of run/nightly.sh: usage, the lock, and two nights against the simulated fleet."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline.cli import export as cli_export

REPO = Path(__file__).resolve().parents[1]
NIGHTLY = REPO / "run" / "nightly.sh"
EXIT_USAGE, EXIT_LOCKED = 2, 75


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without a developer's NIGHTLY_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTLY_", "GEN_PIPELINE"))}
    env |= {"GEN_PIPELINE": f"{sys.executable} -m gen_pipeline", "TRANSFORMERS_VERBOSITY": "error"}
    return env | extra


def nightly(*argv: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(NIGHTLY), *map(str, argv)],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=120,
    )


def missing_commands() -> str | None:
    """Why the end-to-end test cannot run yet, or None."""
    try:
        from gen_pipeline import cli
    except ImportError as exc:
        return f"gen_pipeline.cli is not importable yet: {exc}"
    actions = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = set(actions[0].choices) if actions else set()
    missing = {"generate", "prepare", "simulate"} - commands
    return f"gen-pipeline has no {sorted(missing)} subcommand yet" if missing else None


def test_script_passes_bash_n_and_shellcheck():
    """The script parses, and shellcheck (where installed) finds nothing."""
    subprocess.run(["bash", "-n", str(NIGHTLY)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(["shellcheck", str(NIGHTLY)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_missing_settings_are_usage_errors(tmp_path):
    """Without a source or a dataset dir the script exits 2 and says which is missing."""
    result = nightly("--dataset-dir", tmp_path)
    assert result.returncode == EXIT_USAGE
    assert "no source" in result.stderr
    result = nightly("--source", tmp_path / "x.jsonl")
    assert (result.returncode, "no dataset dir" in result.stderr) == (EXIT_USAGE, True)


def test_a_held_lock_exits_75_and_touches_nothing(tmp_path):
    """A second nightly run on the same dataset exits 75 before preparing anything."""
    ds = tmp_path / "ds"
    ds.mkdir()
    with (ds / ".nightly.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = nightly("--source", tmp_path / "src.jsonl", "--dataset-dir", ds)
    assert result.returncode == EXIT_LOCKED, result.stdout + result.stderr
    assert "holds" in result.stdout
    assert list((ds / "prompts").iterdir()) == []


def source_rows(questions: list[str]) -> list[dict[str, Any]]:
    """Infinity-Instruct-shaped rows."""
    return [
        {
            "id": i,
            "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "old"}],
            "langdetect": "en",
        }
        for i, q in enumerate(questions)
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_two_runs_in_a_night_then_a_new_night(tmp_path):
    """The second run of a night adds nothing; the next night generates only the new prompts."""
    reason = missing_commands()
    if reason:
        pytest.skip(reason)
    from procs import sim_fleet

    ds, src = tmp_path / "ds", tmp_path / "source.jsonl"
    first = [f"Question {i}: tell me about topic {i}" for i in range(6)]
    write_jsonl(src, source_rows([*first, first[0].upper(), "  " + first[1] + " "]))
    gen_args = ["--", "--max-tokens", "32", "--progress", "off"]
    with sim_fleet(2) as servers:
        env = clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers)
        night = ["--dataset-dir", ds, "--date", "2026-01-01", *gen_args]
        one = nightly(*night, env=env)
        assert one.returncode == 0, one.stdout + one.stderr
        completions = ds / "completions.jsonl"
        assert count_lines(completions) == 7  # the upper-cased question is a different prompt
        before = completions.read_bytes()

        two = nightly(*night, env=env)
        assert two.returncode == 0, two.stdout + two.stderr
        assert "nothing to do" in two.stdout
        assert completions.read_bytes() == before

        write_jsonl(src, source_rows([*first, "A brand new question", "Another new one"]))
        three = nightly("--dataset-dir", ds, "--date", "2026-01-02", *gen_args, env=env)
        assert three.returncode == 0, three.stdout + three.stderr
    assert count_lines(ds / "prompts" / "nightly-2026-01-02.jsonl") == 2
    assert count_lines(completions) == 9
    assert (ds / "prompts" / "nightly-2026-01-02.jsonl.done").exists()
    assert (ds / "logs" / "nightly-2026-01-02.log").exists()

    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    cli_export.main(parser.parse_args([str(ds), "--out", str(tmp_path / "dataset")]))
    assert "| rows | 9 |" in (tmp_path / "dataset" / "README.md").read_text()


@pytest.mark.slow
def test_each_night_adds_its_new_input_without_the_another_input_warning(tmp_path):
    """Each night's prompts file is a new --input into the same dataset by design: the nightly job says so
    (--append-input), so generate does not warn that the dataset holds rows answered from another input."""
    reason = missing_commands()
    if reason:
        pytest.skip(reason)
    from procs import sim_fleet

    ds, src = tmp_path / "ds", tmp_path / "source.jsonl"
    gen_args = ["--", "--max-tokens", "16", "--progress", "off"]
    with sim_fleet(1) as servers:
        env = clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers)
        for date, questions in (("2026-01-01", ["first night"]), ("2026-01-02", ["first night", "second night"])):
            write_jsonl(src, source_rows(questions))
            night = nightly("--dataset-dir", ds, "--date", date, *gen_args, env=env)
            assert night.returncode == 0, night.stdout + night.stderr
    assert count_lines(ds / "completions.jsonl") == 2
    logs = night.stdout + night.stderr + (ds / "logs" / "nightly-2026-01-02.log").read_text()
    assert "generate" in logs and "another input" not in logs


def generate_child(pid: int, timeout: float) -> int:
    """The `generate` a nightly run `pid` started, once it holds its run directory (Linux /proc)."""
    from procs import children

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children(pid, 1, timeout):
            with contextlib.suppress(OSError):
                if b"\0generate\0" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
        time.sleep(0.05)
    raise AssertionError(f"nightly {pid} started no generate")


def open_files(pid: int) -> set[Path]:
    """The files process `pid` has open (Linux /proc)."""
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a descriptor closed while we look (an exec)
            if (target := os.readlink(fd)).startswith("/"):
                found.add(Path(target))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("target", ["script", "group"])
def test_a_killed_nightly_leaves_no_generate_behind(tmp_path, target):
    """kill -9 of the script (or its process group) mid-generate: its generate stops at once instead of
    running on unsupervised with the lock, and the next nightly runs (exit 0, not 75)."""
    reason = missing_commands()
    if reason:
        pytest.skip(reason)
    from procs import kill_all, sim_fleet, wait_gone

    ds, src = tmp_path / "ds", tmp_path / "source.jsonl"
    write_jsonl(src, source_rows([f"Question {i}" for i in range(4)]))
    night = ["--source", src, "--dataset-dir", ds, "--date", "2026-01-01", "--", "--max-tokens", "32"]
    night += ["--progress", "off"]
    with sim_fleet(1, "--token-latency", "2") as slow:
        argv = ["bash", str(NIGHTLY), *map(str, night)]
        env = clean_env(NIGHTLY_SERVERS=slow)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        pids = [proc.pid]
        try:
            pids.append(generate_child(proc.pid, timeout=60))
            assert ds / ".nightly.lock" not in open_files(pids[1]), "generate holds the nightly lock"
            os.killpg(proc.pid, 9) if target == "group" else proc.kill()
            proc.wait(timeout=10)
            assert wait_gone(pids[1:], timeout=10) == [], "generate runs on after its nightly was killed"
        finally:
            kill_all(pids)
            proc.wait(timeout=10)
    with sim_fleet(1) as fast:
        again = nightly(*night, env=clean_env(NIGHTLY_SERVERS=fast))
    assert again.returncode == 0, again.stdout + again.stderr
    assert count_lines(ds / "completions.jsonl") == 4
