"""Samples that all come back the same (a server ignoring seed or sampling) are counted and warned about."""

from __future__ import annotations

import pytest
from e2e import prompts, run_sim

from gen_pipeline.progress.identical import IDENTICAL_MIN, SameSamples, greedy
from gen_pipeline.records import Completion


def _done(texts: list[str], server: str = "http://a:1", turn: int | None = None) -> list[Completion]:
    done = [Completion("q", [], t, "stop", 1, 1, 1, 8, server, 1, 0.1, "m", {}, sample=i) for i, t in enumerate(texts)]
    for c in done:
        c.turn = turn
    return done


@pytest.mark.parametrize(
    ("run", "warned"),
    [
        ({"samples": 4}, True),  # one request with n: every choice the same
        ({"samples": 3, "samples_via": "requests", "sampling": {"seed": 5}}, True),  # seeded requests, seed ignored
        ({"samples": 3, "sampling": {"temperature": 0}}, False),  # greedy: identical samples are what was asked
    ],
    ids=["n", "seeded-requests", "greedy"],
)
def test_a_server_ignoring_sampling_is_warned_about(write_jsonl, tmp_path, run, warned):
    """Issue 29: a fleet that ignores seed and sampling answers K identical samples; the summary counts the
    prompts and warns, naming the servers, unless the run asked for greedy decoding."""
    outcome, _ = run_sim(write_jsonl(prompts(12)), tmp_path / "out", sim={"ignore_sampling": True, "n_ports": 2}, **run)
    assert outcome.exit_code == 0
    same = outcome.summary["identical_samples"]
    warnings = [w for w in outcome.summary["warnings"] if "identical samples" in w]
    if warned:
        assert same == {"compared": 12, "identical": 12}
        assert len(warnings) == 1 and warnings[0].startswith("12 of 12 prompts got identical samples (servers: http")
    else:
        assert same == {"compared": 0, "identical": 0} and not warnings


def test_a_server_that_samples_gets_no_warning(write_jsonl, tmp_path):
    """The simulator honours n: its samples differ, nothing is said."""
    outcome, _ = run_sim(write_jsonl(prompts(12)), tmp_path / "out", samples=4)
    assert outcome.summary["identical_samples"] == {"compared": 12, "identical": 0}
    assert not [w for w in outcome.summary["warnings"] if "identical samples" in w]


def test_the_warning_needs_many_prompts_and_most_of_them():
    """A few identical answers (a short factual prompt) are not a server ignoring sampling; the warning is
    new once, when the count crosses the threshold. Samples of different turns are not compared."""
    same = SameSamples()
    assert not same.note(_done(["4", "4"]))
    for _ in range(IDENTICAL_MIN - 2):
        assert not same.note(_done(["a", "b"]))
    assert same.warning() is None  # 1 of 4
    assert not same.note(_done(["x", "x"], turn=0) + _done(["y"], turn=1))  # 2 of 5: under half
    assert same.note(_done(["z", "z", "z"], "http://b:2"))  # 3 of 6
    assert not same.note(_done(["w", "w"]))  # still warned, not new
    assert same.view() == {"compared": 7, "identical": 4}
    assert "(servers: http://a:1 (3), http://b:2 (1))" in (same.warning() or "")  # prompts per server


def test_greedy_table():
    assert greedy({"temperature": 0}) and greedy({"top_k": 1}) and greedy({"temperature": 0.0})
    assert not greedy({}) and not greedy({"temperature": 0.7})


@pytest.mark.parametrize(("sim", "identical"), [({"ignore_sampling": True}, 12), ({}, 0)], ids=["ignored", "sampled"])
def test_the_samples_of_a_conversation_are_compared_too(write_jsonl, tmp_path, sim, identical):
    """--turns all: each conversation's samples are compared at their first turn, as --turns last compares a
    prompt's (a server ignoring the seed made every sample-1 conversation a copy of sample 0's, and the summary
    said compared 0 and warned of nothing)."""
    from e2e import conversation_rows

    rows = conversation_rows(12)
    run = {"turns": "all", "samples": 2, "sampling": {"seed": 5}}  # each sample's requests seeded apart
    outcome, _ = run_sim(write_jsonl(rows), tmp_path / "out", sim={**sim, "n_ports": 2}, **run)
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["identical_samples"] == {"compared": 12, "identical": identical}
    warned = [w for w in outcome.summary["warnings"] if "identical samples" in w]
    assert len(warned) == (1 if identical else 0)
