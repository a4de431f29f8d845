"""What rejected answers cost, counted: summary.json, the printed summary, `report`, the metrics, the dataset
card, the cost per valid token, and the alert when a server's (or the run's) reject rate jumps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from e2e import prompts, read_jsonl, run_sim
from test_metrics import parse, value

from gen_pipeline.engine.summary import merge_summaries
from gen_pipeline.fleet.state import ServerState
from gen_pipeline.progress.alerts import CPU, REJECT_EVIDENCE, SAMPLE_S, Watch
from gen_pipeline.progress.stats import RunStats, format_summary

SIM = {"json_answers": True, "invalid": {"prose": 0.3}, "n_ports": 2}


def run_with_rejects(write_jsonl: Any, out: Path, **run: Any) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    outcome, _ = run_sim(write_jsonl(prompts(30)), out, sim=SIM, validate=("json",), sampling={"seed": 3}, **run)
    return outcome, read_jsonl(out / "completions.jsonl"), read_jsonl(out / "rejected.jsonl")


def test_the_summary_counts_attempts_rejects_and_their_tokens(write_jsonl, tmp_path):
    """summary.json's answers section: attempts, rejects by reason and check, their decode tokens; those are in
    output_tokens but never in valid_output_tokens, so the GPU-hours per million valid tokens count the waste."""
    metrics = tmp_path / "run.prom"
    outcome, done, kept = run_with_rejects(write_jsonl, tmp_path / "out", metrics_file=metrics)
    summary, spent = outcome.summary, sum(r["completion_tokens"] for r in kept)
    assert kept and spent > 0
    assert summary["answers"] == {
        "attempts": len(done) + len(kept),
        "rejected": {"invalid": len(kept)},
        "rejected_by_check": {"json": len(kept)},
        "rejected_tokens": spent,
    }
    assert summary["valid_output_tokens"] == sum(r["completion_tokens"] for r in done)
    assert summary["output_tokens"] == summary["valid_output_tokens"] + spent
    assert summary["gpu_hours_per_million_valid_tokens"] == round(
        summary["gpu_hours"] * 1e6 / summary["valid_output_tokens"], 4
    )
    assert f"rejected {len(kept)} {{'invalid': {len(kept)}}}" in format_summary(summary)
    servers = summary["servers"].values()
    assert sum(sum(s["rejected"].values()) for s in servers if "rejected" in s) == len(kept)
    samples = parse(metrics.read_text())
    assert value(samples, "gen_pipeline_answers_total") == len(done) + len(kept)
    assert value(samples, "gen_pipeline_rejected_answers_total", reason="invalid", check="json") == len(kept)
    assert value(samples, "gen_pipeline_tokens_total", kind="rejected") == spent
    by_status: dict[str, float] = {}
    for (name, labels), n in samples.items():
        if name == "gen_pipeline_requests_total":
            status = dict(labels)["status"]
            by_status[status] = by_status.get(status, 0) + n
    assert by_status == {"ok": len(done), "invalid": len(kept)}


def test_report_and_the_card_count_the_rejects(write_jsonl, tmp_path):
    """`report` and export's dataset card read rejected.jsonl: how many, by check, and their tokens."""
    from gen_pipeline.export.export import ExportConfig, export
    from gen_pipeline.views.report import render_table
    from gen_pipeline.views.rundata import read_completions, read_json

    out = tmp_path / "out"
    _, _, kept = run_with_rejects(write_jsonl, out)
    spent = sum(r["completion_tokens"] for r in kept)
    table = render_table(out, read_completions(out), read_json(out / "summary.json"), None)
    assert f"rejected    {len(kept)} answers in rejected.jsonl {{'invalid': {len(kept)}}}, by check json" in table
    assert "answers     answers judged" in table
    export(ExportConfig(runs=(out,), out=tmp_path / "ds"))
    card = (tmp_path / "ds" / "README.md").read_text()
    assert f"| answers rejected (rejected.jsonl, then resampled) | {len(kept)} |" in card
    assert f"| of them by check | json {len(kept)} |" in card
    assert f"| decode tokens the rejected answers cost | {spent} |" in card


def test_parts_add_their_rejects_up():
    """--workers and claimers: each part's answers section adds up in the merged summary."""
    part: dict[str, Any] = {
        "answers": {
            "attempts": 10,
            "rejected": {"invalid": 2},
            "rejected_by_check": {"json": 2},
            "rejected_tokens": 40,
        },
        "token_drift": {"compared": 0, "by_offset": {}},
        "completed": 8,
        "output_tokens": 100,
    }
    older: dict[str, Any] = {"token_drift": {"compared": 0, "by_offset": {}}, "completed": 1, "output_tokens": 5}
    merged = merge_summaries([part, part, older], 10.0, 0)
    assert merged["answers"] == {
        "attempts": 20,
        "rejected": {"invalid": 4},
        "rejected_by_check": {"json": 4},
        "rejected_tokens": 80,
    }


def _step(watch: Watch, stats: RunStats, servers: list[ServerState], at: float) -> list[str]:
    return [a for a in watch.check(stats, servers, at) if "rejected" in a]


def test_an_alert_when_a_servers_reject_rate_jumps():
    """A server whose answers are rejected far more often lately than before (a broken template, a looping
    checkpoint) is flagged, and the run with it; a steady low rate is not."""
    good, bad = ServerState("http://good:1", 8), ServerState("http://bad:2", 8)
    stats = RunStats(clock=lambda: 0.0)
    watch = Watch(stall_s=1e9, cpu=lambda: CPU(0.0))
    at, alerts = 0.0, []
    for _ in range(40):  # 200 s of answers, 1 in 20 rejected on each server
        for s in (good, bad):
            s.completions += 4
            stats.answers += 4
        if int(at) % 20 == 0:
            bad.rejects["invalid"] += 1
            good.rejects["invalid"] += 1
            stats.rejects["invalid", "json"] += 2
        stats.completed += 8
        alerts = _step(watch, stats, [good, bad], at)
        at += SAMPLE_S
    assert alerts == []
    for _ in range(20):  # then most of the bad server's answers are rejected
        good.completions += 4
        bad.completions += 4
        bad.rejects["degenerate"] += 3
        stats.answers += 8
        stats.rejects["degenerate", "loop"] += 3
        stats.completed += 5
        alerts = _step(watch, stats, [good, bad], at)
        at += SAMPLE_S
    assert [a.split(": ")[0] for a in alerts] == ["http://bad:2", "the run"], alerts
    assert alerts[0].startswith("http://bad:2: 75% of its answers rejected lately (36 of 48), 18% before")


def test_no_reject_alert_before_enough_answers():
    """Fewer than REJECT_EVIDENCE answers in the window are not judged."""
    server, stats = ServerState("http://a:1", 8), RunStats(clock=lambda: 0.0)
    watch = Watch(stall_s=1e9, cpu=lambda: CPU(0.0))
    for i in range(20):
        if i % 4 == 0:
            server.completions += 1
            server.rejects["invalid"] += 1
            stats.answers += 1
            stats.rejects["invalid", "json"] += 1
        assert _step(watch, stats, [server], i * SAMPLE_S) == []
    assert stats.answers < REJECT_EVIDENCE


def test_rejected_lines_are_json_with_their_fields(write_jsonl, tmp_path):
    """Each rejected.jsonl line carries what the docs promise."""
    _, _, kept = run_with_rejects(write_jsonl, tmp_path / "out")
    fields = {"id", "sample", "attempt", "reason", "check", "detail", "completion_tokens", "finish_reason"}
    fields |= {"server", "seed", "messages", "completion", "time"}
    assert all(fields <= r.keys() for r in kept)
    assert all(orjson.loads(orjson.dumps(r)) == r for r in kept)
