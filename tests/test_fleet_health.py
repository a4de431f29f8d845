"""Fleet health end to end: every simulator fault alone and together, outages, hangs, capacity."""

from __future__ import annotations

import pytest
from e2e import check_invariant, prompts, read_jsonl, run_sim

from gen_pipeline.config import RetryPolicy
from gen_pipeline.fleet.pacing import queue_margin

FAULTS = {
    "dead": {"per_port": lambda p: {"dead": (p[0], p[1])}},
    "flaky": {"per_port": lambda p: {"flaky": {p[2]: 0.5}}},
    "slow": {"per_port": lambda p: {"slow": {p[3]: 4.0}}, "token_latency": 0.002},
    "p500": {"p500": 0.1},
    "p503": {"p503": 0.1},
    "p_drop": {"p_drop": 0.1},
    "p_hang": {"p_hang": 0.02},
    "crash": {"per_port": lambda p: {"crash_after": {p[4]: 20}}},
    "crash_restart": {"per_port": lambda p: {"crash_after": {p[4]: 20}}, "restart_after": 0.5, "warmup": 0.3},
    "max_queued": {"max_queued": 2, "max_running": 2, "token_latency": 0.002},
}


def _all_together(p):
    return {
        "dead": (p[0],),
        "flaky": {p[2]: 0.3},
        "slow": {p[3]: 4.0},
        "crash_after": {p[4]: 20},
    }


FAULTS["all"] = {
    "per_port": _all_together,
    "p500": 0.05,
    "p503": 0.05,
    "p_drop": 0.05,
    "p_hang": 0.01,
    "restart_after": 0.5,
    "warmup": 0.3,
    "token_latency": 0.001,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_every_prompt_once(fault, write_jsonl, tmp_path):
    """Under each fault (and all at once) every prompt ends in the output exactly once."""
    rows = prompts(200)
    out = tmp_path / "out"
    sim = {"seed": 5, **FAULTS[fault]}
    outcome, _ = run_sim(
        write_jsonl(rows), out, sim, timeout=90, request_timeout=2.0, retry=RetryPolicy.testing(max_attempts=8)
    )
    assert outcome.exit_code == 0, outcome.summary
    assert check_invariant([r["id"] for r in rows], out) == {"done": 200, "ledger": 0}
    attempts = [r["attempts"] for r in read_jsonl(out / "completions.jsonl")]
    assert max(attempts) <= 8
    if fault in ("dead", "all"):
        dead = [url for url, v in outcome.summary["servers"].items() if v["completions"] == 0]
        assert dead  # the dead port served nothing, and cost no prompt


def test_retry_goes_to_another_server(write_jsonl, tmp_path):
    """A prompt that failed on one server is retried on a different one."""
    rows = prompts(100)
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, {"n_ports": 2, "per_port": lambda p: {"flaky": {p[0]: 1.0}}})
    assert outcome.exit_code == 0
    lines = read_jsonl(out / "completions.jsonl")
    retried = [r for r in lines if r["attempts"] > 1]
    assert retried
    flaky_url = next(u for u, v in outcome.summary["servers"].items() if v["failures"])
    assert all(r["server"] != flaky_url for r in lines)  # every success came from the healthy one


def test_full_outage_then_recovery_fails_nothing(write_jsonl, tmp_path):
    """All ports crash, refuse connections for a while, come back warming up: nothing fails."""
    rows = prompts(160)
    out = tmp_path / "out"
    sim = {
        "n_ports": 4,
        "per_port": lambda p: {"crash_after": {port: 15 for port in p}},
        "restart_after": 2.0,
        "warmup": 0.5,
        "token_latency": 0.002,
    }
    outcome, fleet = run_sim(write_jsonl(rows), out, sim, timeout=90)
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {}
    check_invariant([r["id"] for r in rows], out)
    assert all(s.crashes == 1 and s.restarts == 1 for s in fleet.stats.values())
    assert all(v["out_of_service_s"] >= 1.5 for v in outcome.summary["servers"].values())


def test_outage_timeout_stops_cleanly_with_exit_4(write_jsonl, tmp_path):
    """When no server comes back within --outage-timeout the run stops resumably with code 4."""
    rows = prompts(100)
    out = tmp_path / "out"
    sim = {"n_ports": 2, "per_port": lambda p: {"crash_after": {port: 10 for port in p}}}
    outcome, _ = run_sim(write_jsonl(rows), out, sim, timeout=60, outage_timeout=1.5, grace_period=0.5)
    assert outcome.exit_code == 4
    assert "no server usable" in outcome.summary["stop_reason"]
    assert outcome.summary["failed"] == {}  # nothing was failed for the outage
    check_invariant([r["id"] for r in read_jsonl(out / "completions.jsonl")], out)


def test_capacity_comes_from_the_server(write_jsonl, tmp_path):
    """Without --concurrency each server runs its own max_running_requests, with the queue margin waiting."""
    rows = prompts(120)
    out = tmp_path / "out"
    outcome, fleet = run_sim(
        write_jsonl(rows), out, {"n_ports": 2, "max_running": 3, "token_latency": 0.003}, concurrency=None
    )
    assert outcome.exit_code == 0
    margin = queue_margin(3)
    assert all(s.max_running == 3 and s.max_in_flight == 3 + margin for s in fleet.stats.values())
    assert all(v["capacity"] == 3 and v["queue_margin"] == margin for v in outcome.summary["servers"].values())


def test_queue_margin_zero_keeps_no_more_in_flight_than_the_server_runs(write_jsonl, tmp_path):
    """--queue-margin 0: each server gets exactly its max_running_requests in flight."""
    rows = prompts(120)
    out = tmp_path / "out"
    sim = {"n_ports": 2, "max_running": 3, "token_latency": 0.003}
    outcome, fleet = run_sim(write_jsonl(rows), out, sim, concurrency=None, queue_margin=0)
    assert outcome.exit_code == 0
    assert all(s.max_in_flight == 3 for s in fleet.stats.values())


def test_slow_server_gets_a_smaller_share(write_jsonl, tmp_path):
    """A server four times slower receives roughly a quarter of the work, with no setting."""
    rows = prompts(400)
    out = tmp_path / "out"
    sim = {"n_ports": 2, "max_running": 4, "token_latency": 0.003, "per_port": lambda p: {"slow": {p[1]: 4.0}}}
    outcome, fleet = run_sim(write_jsonl(rows), out, sim, timeout=120, concurrency=None)
    assert outcome.exit_code == 0
    fast, slow = (s.completions for s in fleet.stats.values())
    assert 0.12 < slow / (fast + slow) < 0.35, (fast, slow)


def test_summary_matches_what_each_server_saw(write_jsonl, tmp_path):
    """Requests per server are those the server received; a dead server got none and was out of service all
    run; one answering 30% of requests with an instant 502 stayed in service and kept doing its share."""
    rows = prompts(400)
    out = tmp_path / "out"
    faults = lambda p: {"dead": (p[0],), "bad_gateway": {p[1]: 0.3}, "slow": {p[2]: 4.0}}  # noqa: E731
    sim = {"n_ports": 5, "max_running": 4, "token_latency": 0.002, "per_port": faults}
    outcome, fleet = run_sim(write_jsonl(rows), out, sim, timeout=120, concurrency=None)
    assert outcome.exit_code == 0
    check_invariant([r["id"] for r in rows], out)
    views = [outcome.summary["servers"][url] for url in fleet.urls]
    assert [v["requests"] for v in views] == [s.requests for s in fleet.stats.values()]
    dead, flaky, _, *healthy = views
    assert dead["requests"] == 0 and abs(dead["out_of_service_s"] - outcome.summary["elapsed_s"]) < 0.5
    assert flaky["out_of_service_s"] == 0 and flaky["failures"]["server_error"] > 0
    assert flaky["completions"] > 0.6 * min(v["completions"] for v in healthy)
    assert outcome.summary["tail_s"] is not None
