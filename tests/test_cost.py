"""GPU-hours and useful tokens: summary.json, `report`, the dataset card, and the merge of parts."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from e2e import prompts, read_jsonl, run_sim

from gen_pipeline.cli import main
from gen_pipeline.engine.summary import merge_summaries
from gen_pipeline.progress.cost import useful_tokens
from gen_pipeline.records import Completion, Failure


def _input(tmp_path: Path, n: int) -> Path:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(n)))
    return inp


@pytest.mark.slow
def test_summary_has_gpu_hours_and_the_cost_of_useful_tokens(tmp_path: Path, capsys) -> None:
    """GPU-hours = elapsed x servers x --gpus-per-server; valid tokens are the written rows', untruncated
    ones leave out finish_reason length; report and the dataset card show them."""
    out = tmp_path / "out"
    outcome, _ = run_sim(_input(tmp_path, 40), out, {"n_ports": 2}, max_tokens=16, min_tokens=8, gpus_per_server=4)
    s = outcome.summary
    assert s["gpus_per_server"] == 4
    assert abs(s["gpu_hours"] - s["elapsed_s"] * 2 * 4 / 3600) < 1e-3
    rows = read_jsonl(out / "completions.jsonl")
    untruncated = sum(r["completion_tokens"] for r in rows if r["finish_reason"] != "length")
    assert s["valid_output_tokens"] == sum(r["completion_tokens"] for r in rows) == s["output_tokens"]
    assert s["untruncated_output_tokens"] == untruncated < s["valid_output_tokens"]  # some rows hit max_tokens
    assert s["gpu_hours_per_million_output_tokens"] == round(s["gpu_hours"] * 1e6 / s["output_tokens"], 4)
    assert s["gpu_hours_per_million_untruncated_tokens"] == round(s["gpu_hours"] * 1e6 / untruncated, 4)
    assert orjson.loads((out / "summary.json").read_bytes())["gpu_hours"] == s["gpu_hours"]
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out
    assert f"GPU-hours {s['gpu_hours']} (4 per server)" in printed
    on_disk = orjson.loads((out / "summary.json").read_bytes())
    per_million = re.findall(r"^cost +GPU-hours .* \| per million output tokens (\S+),", printed, re.MULTILINE)
    assert [float(x) for x in per_million] == [on_disk["gpu_hours_per_million_output_tokens"]], printed
    dataset = tmp_path / "ds"
    assert main(["export", str(out), "--out", str(dataset), "--drop-truncated"]) == 0
    card = (dataset / "README.md").read_text()
    assert (
        f"GPU-hours per million untruncated output tokens, last run | {s['gpu_hours_per_million_untruncated_tokens']}"
        in card
    )


def test_parts_add_their_gpu_hours_and_the_merge_derives_the_rates() -> None:
    """--workers K: each part's GPU-hours is its share; the merge adds them and recomputes per million."""
    part = {"completed": 1, "output_tokens": 500_000, "valid_output_tokens": 400_000, "untruncated_output_tokens": 0}
    parts = [{**part, "gpu_hours": 0.5, "gpus_per_server": 2}, {**part, "gpu_hours": 0.25, "gpus_per_server": 2}]
    merged = merge_summaries(parts, 100.0, 0)
    assert merged["gpu_hours"] == 0.75
    assert merged["gpu_hours_per_million_output_tokens"] == 0.75
    assert merged["gpu_hours_per_million_valid_tokens"] == round(0.75 / 0.8, 4)
    assert merged["gpu_hours_per_million_untruncated_tokens"] is None
    assert merged["valid_output_tokens_per_s"] == 8000.0


def test_useful_tokens_share_out_a_request_with_n() -> None:
    """Choices of one request carry no count: its tokens are shared; ledgered samples count nothing."""

    def done(sample: int, finish: str) -> Completion:
        return Completion(id=1, messages=[], completion="x", finish_reason=finish, input_tokens=1,
                          prompt_tokens=1, completion_tokens=None, max_tokens=8, server="s", attempts=1,
                          latency_s=0.1, model="m", meta={}, sample=sample)  # fmt: skip

    failed = Failure(1, 0, "timeout", "slow", sample=2)
    assert useful_tokens([done(0, "stop"), done(1, "length"), failed], 30) == (30, 15)
