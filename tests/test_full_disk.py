"""A write that fails (file-size limit, a full filesystem): the cause is on stderr in one line, whatever
the number of workers, the run exits 5, and what was written stays resumable."""

from __future__ import annotations

import contextlib
import resource
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import check_invariant, prompts
from procs import run_generate, sim_fleet

pytestmark = pytest.mark.slow
# two shards, so a shard's file grows past the limit
WORKERS = pytest.mark.parametrize(
    "workers", [[], ["--workers", "2", "--shards", "2"]], ids=["one process", "two workers"]
)


def limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def causes(stderr: str) -> list[str]:
    """The lines that say why the output could not be written."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if "cannot write" in line]


@WORKERS
def test_a_file_size_limit_is_reported_on_stderr(write_jsonl, tmp_path, workers):
    """EFBIG on the completions file: exit 5, and one 'error: cannot write FILE: File too large' line per
    process that hit it, on stderr; the resume completes exactly."""
    rows = prompts(300)
    path, out = write_jsonl(rows), tmp_path / "out"
    with sim_fleet(2) as servers:
        limited = run_generate(path, out, servers, *workers, timeout=120, preexec_fn=limit_file_size(30_000))
        assert limited.returncode == 5, limited.stderr
        said = causes(limited.stderr)
        assert said and all(line.startswith("error: cannot write ") for line in said), limited.stderr
        assert all("completions" in line and "File too large" in line for line in said), limited.stderr
        again = run_generate(path, out, servers, *workers, timeout=120)
    assert again.returncode == 0, again.stderr
    assert check_invariant([r["id"] for r in rows], out) == {"done": 300, "ledger": 0}


@contextlib.contextmanager
def tiny_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (needs root; the test is skipped otherwise)."""
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@WORKERS
def test_a_full_filesystem_is_reported_on_stderr(write_jsonl, tmp_path, workers):
    """ENOSPC on a full tmpfs: exit 5 with the cause on stderr in one line per process that hit it, even
    when there is then no room for summary.json either."""
    path = write_jsonl(prompts(400))
    with tiny_filesystem(tmp_path / "disk", "48k") as disk, sim_fleet(2) as servers:
        full = run_generate(path, disk / "out", servers, *workers, timeout=120)
    assert full.returncode == 5, full.stderr
    said = causes(full.stderr)
    assert said and all(line.startswith("error: cannot ") for line in said), full.stderr
    assert any("completions" in line and "No space left on device" in line for line in said), full.stderr
    assert not any("summary.json" in line for line in said), full.stderr  # a consequence, not the cause
