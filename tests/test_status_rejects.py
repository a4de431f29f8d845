"""`gen-pipeline status` shows the rejected answers of a run while it runs (status.json's answers section), of
one that crashed (rejected.jsonl counted with the other files) and of a --workers or claimed run (merged)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from e2e import prompts, read_jsonl, run_sim
from test_status_alive import inspect_held

from gen_pipeline.engine.summary import merge_statuses, write_status
from gen_pipeline.rundir.layout import STATUS, SUMMARY
from gen_pipeline.views.status import inspect_run
from gen_pipeline.views.statustext import status_lines

SIM = {"json_answers": True, "invalid": {"prose": 0.3, "empty": 0.1}, "n_ports": 2}


def run_with_rejects(write_jsonl: Any, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A simulated run whose answers are rejected now and then (prose by --validate json, empty by hygiene):
    its summary and rejected.jsonl."""
    outcome, _ = run_sim(write_jsonl(prompts(40)), out, sim=SIM, validate=("json",), sampling={"seed": 3})
    return outcome.summary, read_jsonl(out / "rejected.jsonl")


def as_running(out: Path) -> dict[str, Any]:
    """The run's last status.json as a snapshot of a run still running, summary.json gone."""
    status = orjson.loads((out / STATUS).read_bytes())
    status.update(state="running", updated=time.time(), last_settled=time.time())
    write_status(out / STATUS, status)
    (out / SUMMARY).unlink()
    return status


def test_status_shows_the_rejects_of_a_running_run_by_reason_with_their_rate(write_jsonl, tmp_path):
    """status.json counts the answers judged and those rejected (by reason, by check, their tokens), each server's
    rejects too; `status` prints them as a count, a rate and the reasons, not only as an alert."""
    out = tmp_path / "out"
    summary, kept = run_with_rejects(write_jsonl, out)
    reasons: dict[str, int] = {}
    for r in kept:
        reasons[r["check"]] = reasons.get(r["check"], 0) + 1
    assert set(reasons) == {"json", "empty"}, reasons
    status = as_running(out)
    assert status["answers"] == summary["answers"]
    assert status["answers"]["rejected"] == {"invalid": len(kept)}
    assert status["answers"]["rejected_by_check"] == reasons
    by_server = [s.get("rejected", {}).get("invalid", 0) for s in status["servers"].values()]
    assert sum(by_server) == len(kept)
    text, code = inspect_held(out)
    judged = summary["answers"]["attempts"]
    rate = 100 * len(kept) / judged
    checks = ", ".join(f"{c} {n}" for c, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    head = f"answers: {judged} judged, {len(kept)} rejected ({rate:.1f}%): invalid {len(kept)} (by check: {checks})"
    assert head in text.splitlines(), text
    assert code == 0 and text.splitlines()[1].startswith("running")
    for url, s in status["servers"].items():
        if s.get("rejected"):
            [line] = [x for x in text.splitlines() if x.startswith(f"  {url}  ")]
            assert line.endswith(f"rejected {s['rejected']}"), line


def test_status_of_a_crashed_run_counts_rejected_jsonl(write_jsonl, tmp_path):
    """A run gone without its summary: the files' counts include the rejected answers kept in rejected.jsonl."""
    out = tmp_path / "out"
    _, kept = run_with_rejects(write_jsonl, out)
    as_running(out)
    text, code = inspect_run(out)
    assert code != 0 and "not running" in text
    [files] = [line for line in text.splitlines() if line.startswith("files: ")]
    assert f"rejected.jsonl {len(kept)} {{'invalid': {len(kept)}}}" in files, files


def test_a_run_with_no_rejects_shows_no_answers_line():
    """No reject, no line: a plain run's status is as it was."""
    status = {"counts": {"done": 3}, "answers": {"attempts": 3, "rejected": {}}, "servers": {}}
    assert not [line for line in status_lines(status) if line.startswith("answers")]


def test_the_parts_rejects_add_up_in_a_merged_status():
    """--workers and claimers: the answers sections of the parts' status files add up, an older part's without."""
    part = {
        "updated": 1.0,
        "answers": {"attempts": 10, "rejected": {"invalid": 2}, "rejected_by_check": {"json": 2}, "rejected_tokens": 8},
        "servers": {"http://a:1": {"requests": 5, "rejected": {"invalid": 2}}},
    }
    older = {"updated": 1.0, "servers": {"http://a:1": {"requests": 5}}}
    merged = merge_statuses([part, part, older], [part])
    assert merged["answers"] == {
        "attempts": 20,
        "rejected": {"invalid": 4},
        "rejected_by_check": {"json": 4},
        "rejected_tokens": 16,
    }
    assert merged["servers"]["http://a:1"]["rejected"] == {"invalid": 4}
    assert "answers" not in merge_statuses([older], [older])
