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
def tiny_filesystem(where: Path, size: str, options: str = "") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` with these extra mount `options` (needs root; the test is
    skipped otherwise)."""
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    opts = f"size={size}{options}"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
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


@WORKERS
@pytest.mark.parametrize("new", [False, True], ids=["existing directory", "new directory"])
def test_a_read_only_filesystem_is_one_line_and_exit_5(write_jsonl, tmp_path, workers, new):
    """--out on a read-only filesystem, the directory there already or still to be made: exit 5 and one
    'error: cannot create ...: Read-only file system' line, no traceback (the servers are never reached)."""
    path = write_jsonl(prompts(3))
    with tiny_filesystem(tmp_path / "ro", "1m", ",ro") as ro:
        out = ro / "runs" / "new" if new else ro
        refused = run_generate(path, out, "127.0.0.1:9", *workers, timeout=60)
    assert refused.returncode == 5, refused.stderr
    [said] = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert "cannot create" in said and "Read-only file system" in said, refused.stderr
    assert "Traceback" not in refused.stderr
