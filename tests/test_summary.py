"""The one merge of several processes' figures, rule by rule."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from e2e import run_sim

from gen_pipeline.engine.summary import DERIVED, STATUS_RULES, SUMMARY_RULES, PerKey, merge_statuses, merge_summaries


def _summary(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "read": 0, "completed": 0, "requests": 0, "repeats_dropped": 0, "input_tokens": 0, "output_tokens": 0,
        "skipped": {}, "failed": {}, "finish_reasons": {}, "stop_reason": None, "learned_offset": 0,
        "input_cursor": None, "warnings": [], "servers": {},
        "token_drift": {"compared": 0, "differed": 0, "by_offset": {}},
    }  # fmt: skip
    return {**base, **fields}


@pytest.mark.parametrize(
    ("field", "values", "merged"),
    [
        ("completed", [3, 4], 7),
        ("failed", [{"timeout": 1}, {"timeout": 2, "bad_input": 1}], {"timeout": 3, "bad_input": 1}),
        ("stop_reason", [None, "interrupted by SIGTERM", "interrupted by SIGTERM"], "interrupted by SIGTERM"),
        ("learned_offset", [0, 2, 1], 2),
        ("input_cursor", [{"line": 9, "bytes": 90}, {"line": 4, "bytes": 40}], {"line": 4, "bytes": 40}),
        ("input_cursor", [{"line": 9, "bytes": 90}, None], None),
        ("warnings", [["b", "a"], ["a"]], ["a", "b"]),
    ],
)
def test_each_summary_field_adds_up_by_its_rule(field: str, values: list[Any], merged: Any) -> None:
    """Counts add, tallies add by name, the offset is the largest, the cursor the earliest (or none)."""
    assert merge_summaries([_summary(**{field: v}) for v in values], elapsed=2.0, exit_code=0)[field] == merged


def test_servers_and_drift_merge_per_key_and_rates_use_the_whole_run() -> None:
    """Per server: requests add, failures tally, out of service is the longest; drift adds by offset."""
    a = _summary(completed=4, output_tokens=40, token_drift={"compared": 4, "differed": 1, "by_offset": {"2": 1}},
                 servers={"u": {"requests": 3, "failures": {"timeout": 1}, "out_of_service_s": 1.5,
                                "mean_latency_s": None}})  # fmt: skip
    b = _summary(completed=2, output_tokens=20, token_drift={"compared": 2, "differed": 2, "by_offset": {"2": 2}},
                 servers={"u": {"requests": 1, "out_of_service_s": 0.5, "mean_latency_s": 0.25},
                          "v": {"requests": 2}})  # fmt: skip
    merged = merge_summaries([a, b], elapsed=2.0, exit_code=3)
    assert merged["servers"]["u"]["requests"] == 4
    assert merged["servers"]["u"]["failures"] == {"timeout": 1}
    assert merged["servers"]["u"]["out_of_service_s"] == 1.5
    assert merged["servers"]["u"]["mean_latency_s"] == 0.25
    assert merged["servers"]["v"]["mean_latency_s"] is None
    assert merged["token_drift"] == {"compared": 6, "by_offset": {"2": 3}, "differed": 3}
    assert (merged["requests_per_s"], merged["output_tokens_per_s"], merged["workers"]) == (3.0, 30.0, 2)
    assert merged["exit_code"] == 3


def test_live_figures_come_from_running_parts_and_history_from_all() -> None:
    """A finished part's done count stays; its in-flight, rates and health do not; its ETA neither."""
    old = {"updated": 10.0, "state": "finished", "counts": {"done": 5, "in_flight": 9}, "rates": {"req_per_s": 7.0},
           "eta_s": None, "servers": {"u": {"healthy": False, "in_flight": 9, "requests": 5}},
           "last_error": {"timeout": "old"}}  # fmt: skip
    new = {"updated": 20.0, "state": "running", "counts": {"done": 1, "in_flight": 2}, "rates": {"req_per_s": 1.0},
           "eta_s": 30.0, "servers": {"u": {"healthy": True, "in_flight": 2, "requests": 1}},
           "last_error": {"timeout": "new"}}  # fmt: skip
    merged = merge_statuses([new, old], [new])
    assert merged["counts"]["done"] == 6 and merged["counts"]["in_flight"] == 2
    assert merged["rates"]["req_per_s"] == 1.0 and merged["eta_s"] == 30.0
    assert merged["servers"]["u"] == {"in_flight": 2, "capacity": 0, "healthy": True, "requests": 6, "failures": {}}
    assert merged["state"] == "running" and merged["updated"] == 20.0
    assert merged["last_error"] == {"timeout": "new"}


def test_an_unknown_eta_of_any_running_part_makes_the_run_eta_unknown() -> None:
    """The parts share no rows: the run ends with the slowest, so one unknown ETA is the run's."""
    parts = [{"updated": 1.0, "state": "running", "eta_s": 5.0}, {"updated": 2.0, "state": "running", "eta_s": None}]
    assert merge_statuses(parts, parts)["eta_s"] is None
    assert merge_statuses(parts[:1], parts[:1])["eta_s"] == 5.0


def _keys(doc: dict[str, Any], rules: dict[str, Any], where: str = "") -> set[str]:
    """Every field of `doc` (nested, servers by URL) that `rules` has no rule for."""
    missing = set()
    for key, value in doc.items():
        rule = rules.get(key)
        if rule is None:
            missing.add(where + key)
        elif isinstance(rule, dict):
            missing |= _keys(value or {}, rule, f"{where}{key}.")
        elif isinstance(rule, PerKey):
            for view in (value or {}).values():
                missing |= _keys(view, rule.rules, f"{where}{key}.*.")
    return missing


def test_every_field_a_run_writes_has_a_merge_rule(write_jsonl, tmp_path):
    """A field added to summary.json or status.json without a rule would vanish from a --workers run's merge."""
    rows = [{"id": i, "prompt": f"question {i}"} for i in range(20)]
    outcome, _ = run_sim(write_jsonl(rows), tmp_path / "out", {"n_ports": 2})
    assert outcome.exit_code == 0
    assert _keys(outcome.summary, SUMMARY_RULES) - DERIVED == set()
    status = orjson.loads((tmp_path / "out" / "status.json").read_bytes())
    assert _keys(status, STATUS_RULES) - {"pid", "last_error"} == set()
