"""A run directory written by gen-pipeline 0.1.0 (before RunDir, samples and claimed shards) still resumes.

tests/fixtures/rundir-0.1.0 was written by 0.1.0 itself: 40 of prompts.jsonl's 60 rows done, once by a
single process (single/) and once by `--workers 2` (workers/, whose completions-00001.jsonl ends in a torn
line, as after kill -9); prompts.jsonl also has one line that is not JSON. Resuming with today's code must
send only the 20 new rows, ledger the bad line, and leave every id exactly once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from e2e import check_invariant, run_sim

from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.tokens import TINY_TOKENIZER

FIXTURE = Path(__file__).parent / "fixtures" / "rundir-0.1.0"


def _copy(layout: str, tmp_path: Path) -> Path:
    """The fixture's run directory, its manifest pointing at this checkout's tiny tokenizer."""
    out = tmp_path / layout
    shutil.copytree(FIXTURE / layout, out)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    manifest["tokenizer"] = str(TINY_TOKENIZER)
    (out / "manifest.json").write_bytes(orjson.dumps(manifest))
    return out


@pytest.mark.parametrize(("layout", "workers"), [("single", 1), ("workers", 1), ("workers", 2), ("single", 2)])
def test_a_run_directory_of_version_0_1_0_resumes_exactly_once(tmp_path, layout, workers):
    """Only the 20 rows 0.1.0 had not done are sent; the torn tail is moved aside; every id ends once."""
    out = _copy(layout, tmp_path)
    whole = [line for p in RunDir(out).completion_files() for line in p.read_bytes().split(b"\n") if line]
    assert len({orjson.loads(line)["id"] for line in whole if line.endswith(b"}")}) == 40
    sim = {"n_ports": 2, "tokenizer": str(TINY_TOKENIZER), "context_length": 2048}
    outcome, fleet = run_sim(FIXTURE / "prompts.jsonl", out, sim, tokenizer=str(TINY_TOKENIZER), max_tokens=16)
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["completed"] == 20 and outcome.summary["failed"] == {"bad_input": 1}
    assert sum(s.requests for s in fleet.stats.values()) == 20  # nothing done before is sent again
    ids = [orjson.loads(line)["id"] for line in (FIXTURE / "prompts.jsonl").read_bytes().splitlines()[:-1]]
    assert check_invariant(ids, out) == {"done": 60, "ledger": 0}
