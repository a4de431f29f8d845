"""The benchmark's own pieces keep working: bench/canned.py serves both clients of bench/perf.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
from e2e import prompts, read_jsonl
from procs import env, run_generate

from gen_pipeline.sim import free_ports
from gen_pipeline.tokens import TINY_TOKENIZER

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_canned_server_serves_generate_and_the_bare_script(write_jsonl, tmp_path):
    """generate completes every row against it, with no token drift recorded (its usage has no
    prompt_tokens), and so does the bare aiohttp script the bench compares against."""
    sys.path.insert(0, str(BENCH))
    try:
        from perf import BARE
        from simfleet import canned_process
    finally:
        sys.path.remove(str(BENCH))
    rows = prompts(40)
    path, out = write_jsonl(rows), tmp_path / "out"
    (tmp_path / "bare.py").write_text(BARE)
    ports = free_ports(2)
    with canned_process(ports):
        servers = ",".join(f"127.0.0.1:{p}" for p in ports)
        done = run_generate(path, out, servers, "--tokenizer", str(TINY_TOKENIZER))  # it names none
        urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        bare = subprocess.run([sys.executable, str(tmp_path / "bare.py"), str(path), str(tmp_path / "bare.out"), urls],
                              env=env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["completed"] == 40 and summary["token_drift"]["compared"] == 0
    assert sorted(r["id"] for r in read_jsonl(out / "completions.jsonl")) == sorted(r["id"] for r in rows)
    assert bare.returncode == 0, bare.stderr
    assert len((tmp_path / "bare.out").read_text().splitlines()) == 40
