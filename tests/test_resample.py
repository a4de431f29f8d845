"""Rejected answers end to end against the simulator: kept in rejected.jsonl, resampled with a new seed up to
--max-resamples, then ledgered invalid; never written, never counted against the server, never paid twice."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import orjson
from e2e import assert_regenerated, check_invariant, conversation_rows, prompts, read_jsonl, run_sim

from gen_pipeline.records import id_key
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.samples import answer_seed, place_key

SEED = 11


def rejects(out: Any) -> list[dict[str, Any]]:
    return [r for path in RunDir(out).rejected_files() for r in read_jsonl(path)]


def completions(out: Any) -> list[dict[str, Any]]:
    return [r for path in RunDir(out).completion_files() for r in read_jsonl(path)]


def ledger(out: Any) -> list[dict[str, Any]]:
    return [r for path in RunDir(out).failure_files() for r in read_jsonl(path)]


def requests(fleet: Any) -> int:
    return sum(s.requests for s in fleet.stats.values())


def test_rejected_answers_are_kept_and_resampled_with_new_seeds(write_jsonl, tmp_path):
    """--validate json against prose-wrapped answers: every row ends valid JSON or ledgered, each reject is a
    line of rejected.jsonl, and each resample is sent with the seed of its attempt."""
    rows = prompts(40)
    sim = {"json_answers": True, "invalid": {"prose": 0.3}, "n_ports": 2}
    outcome, fleet = run_sim(write_jsonl(rows), tmp_path / "out", sim=sim, validate=("json",), sampling={"seed": SEED})
    check_invariant([r["id"] for r in rows], tmp_path / "out")
    done, kept = completions(tmp_path / "out"), rejects(tmp_path / "out")
    assert all(isinstance(orjson.loads(r["completion"]), dict) for r in done)
    assert kept and all(r["check"] == "json" and r["reason"] == "invalid" for r in kept)
    assert all(r["completion"].startswith("Sure!") and r["messages"] for r in kept)  # the text itself is kept
    assert all(r["prompt_tokens"] == r["input_tokens"] > 0 for r in kept)  # its prefill, counted both ways
    by_key: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for r in kept:
        assert r["seed"] == answer_seed(SEED, r["id"], r["sample"], 0, r["attempt"])
        by_key[(r["id"], r["sample"])].append(r["attempt"])
    assert all(sorted(a) == list(range(len(a))) for a in by_key.values())  # attempts 0, 1, ... per key
    for r in done:  # a written answer says how many were rejected before it, and was sent with the next seed
        spent = len(by_key.get((r["id"], r["sample"]), []))
        assert r.get("rejected", 0) == spent
        assert r["sampling"]["seed"] == answer_seed(SEED, r["id"], r["sample"], 0, spent)
    assert requests(fleet) == len(done) + len(kept)
    failed = ledger(tmp_path / "out")
    assert all(f["reason"] == "invalid" and f["attempts"] == 3 for f in failed)  # 0.3**3: a few rows, maybe
    assert len(done) + len(failed) == len(rows)
    assert outcome.summary["failed"] == ({"invalid": len(failed)} if failed else {})
    servers = outcome.summary["servers"].values()
    assert all(not s["failures"] for s in servers)  # a rejected answer is not the server's fault
    assert sum(sum((s.get("rejected") or {}).values()) for s in servers) == len(kept)
    assert sum(s["completions"] for s in servers) == len(done)


def test_the_bound_then_the_ledger_and_a_rerun_pays_nothing(write_jsonl, tmp_path):
    """Answers rejected every time: 1 + --max-resamples attempts, then `invalid` for good; a rerun skips the
    rows, and --retry-failed invalid gives each as many attempts again, their numbers going on."""
    rows = prompts(6)
    path, out = write_jsonl(rows), tmp_path / "out"
    sim = {"invalid": {"think_marker": 1.0}, "n_ports": 2}  # hygiene: no --validate needed
    outcome, fleet = run_sim(path, out, sim=sim, max_resamples=1, sampling={"seed": SEED})
    assert completions(out) == [] and requests(fleet) == 12
    assert Counter(r["attempt"] for r in rejects(out)) == {0: 6, 1: 6}
    assert {r["check"] for r in rejects(out)} == {"think_marker"}
    assert outcome.summary["failed"] == {"invalid": 6} and outcome.exit_code == 0  # permanent: the run is done
    assert all("2 answers rejected in a row (--max-resamples 1)" in f["detail"] for f in ledger(out))
    last = {r["id"]: r["server"] for r in rejects(out) if r["attempt"] == 1}
    assert {f["id"]: f["server"] for f in ledger(out)} == last  # who gave the last reject (null before)
    again, fleet = run_sim(path, out, sim=sim, max_resamples=1, sampling={"seed": SEED})
    assert requests(fleet) == 0 and again.summary["skipped"] == {"invalid": 6}
    retry = frozenset({"invalid"})
    third, fleet = run_sim(path, out, sim=sim, max_resamples=1, sampling={"seed": SEED}, retry_failed=retry)
    assert requests(fleet) == 12 and third.summary["failed"] == {"invalid": 6}
    assert Counter(r["attempt"] for r in rejects(out)) == {0: 6, 1: 6, 2: 6, 3: 6}


def test_a_resume_counts_the_rejects_already_kept(write_jsonl, tmp_path):
    """Rejects kept by a run that died before its ledger line count toward the bound: a key rejected as often
    as the bound allows is ledgered without a request; one rejected once gets the attempts left, seeded on."""
    rows = prompts(2)
    path, out = write_jsonl(rows), tmp_path / "out"
    out.mkdir()
    line = {"sample": 0, "reason": "invalid", "check": "json", "detail": "json: not JSON", "time": 1.0}
    kept = [{"id": 0, "attempt": a, **line} for a in range(3)] + [{"id": 1, "attempt": 0, **line}]
    (out / "rejected.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    sim = {"json_answers": True, "invalid": {"prose": 1.0}, "n_ports": 1}
    outcome, fleet = run_sim(path, out, sim=sim, validate=("json",), sampling={"seed": SEED})
    assert requests(fleet) == 2  # row 1's attempts 1 and 2; row 0 none
    assert sorted(r["attempt"] for r in rejects(out) if r["id"] == 1) == [0, 1, 2]
    assert {f["id"]: f["attempts"] for f in ledger(out)} == {0: 3, 1: 3}
    assert outcome.summary["failed"] == {"invalid": 2}


def test_samples_with_n_resample_only_the_rejected_choices(write_jsonl, tmp_path):
    """--samples K in one request with n: a rejected choice is kept, its sample resampled alone; the goal is
    K valid samples per row."""
    rows = prompts(20)
    sim = {"json_answers": True, "invalid": {"prose": 0.25}, "n_ports": 2}
    outcome, _ = run_sim(write_jsonl(rows), tmp_path / "out", sim=sim, validate=("json",), samples=3)
    done = completions(tmp_path / "out")
    places = Counter((r["id"], r["sample"]) for r in done)
    failed = {(f["id"], f["sample"]) for f in ledger(tmp_path / "out")}
    assert all(n == 1 for n in places.values())
    assert set(places) | failed == {(r["id"], s) for r in rows for s in range(3)}
    assert all(isinstance(orjson.loads(r["completion"]), dict) for r in done)
    assert rejects(tmp_path / "out") and not (set(places) & {(r["id"], r["sample"]) for r in ledger(tmp_path / "out")})
    assert all(r["prompt_tokens"] == r["input_tokens"] > 0 for r in rejects(tmp_path / "out"))  # the answer's usage
    assert outcome.summary["completed"] == len(done)


def test_a_turn_is_checked_before_the_next_builds_on_it(write_jsonl, tmp_path):
    """--turns all: a rejected turn is resampled before the next turn is asked on it; each line's history holds
    only answers that passed, and a turn that never passes ends its conversation there."""
    rows = conversation_rows(12, turns=3)
    sim = {"reasoning_words": 6, "invalid": {"unfinished": 0.3}, "n_ports": 2}
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, sim=sim, turns="all", sampling={"seed": SEED})
    done = completions(out)
    ended = {(f["id"], f["sample"]): f["turn"] for f in ledger(out)}
    assert all(f["reason"] == "invalid" for f in ledger(out))
    lines = {(r["id"], r["sample"], r["turn"]): r for r in done}
    for (rid, s, t), r in lines.items():
        assert r["completion"] and r["finish_reason"] != "length"
        assert t < ended.get((rid, s), 99)
        if t:
            before = lines[(rid, s, t - 1)]
            assert r["messages"][: len(before["messages"]) + 1][-1]["content"] == before["completion"]
    assert {k: v for k, v in Counter(r["check"] for r in rejects(out)).items()} == {
        "unfinished_reasoning": len(rejects(out))
    }
    if not ended:
        assert_regenerated(rows, out, 1)
    assert outcome.summary["conversations"]["ended_early"] == len(ended)


def test_keys_of_rejects_match_the_lines_they_precede(write_jsonl, tmp_path):
    """A reject's (id, sample, turn) is the key of the answer it was resampled into."""
    rows = prompts(10)
    sim = {"json_answers": True, "invalid": {"empty": 0.4}, "n_ports": 1}
    run_sim(write_jsonl(rows), tmp_path / "out", sim=sim, sampling={"seed": SEED})
    done = {place_key(id_key(r["id"]), r["sample"], 0) for r in completions(tmp_path / "out")}
    failed = {place_key(id_key(f["id"]), f["sample"], 0) for f in ledger(tmp_path / "out")}
    kept = {place_key(id_key(r["id"]), r["sample"], 0) for r in rejects(tmp_path / "out")}
    assert kept and kept <= done | failed and {r["check"] for r in rejects(tmp_path / "out")} == {"empty"}


def test_export_rejected_writes_preference_pairs(write_jsonl, tmp_path):
    """export --rejected: OUT/rejected/ holds one row per rejected answer, its prompt, the rejected answer and the
    answer that passed for the same key (chosen; none when every answer was rejected), with why."""
    import datasets
    import pytest

    from gen_pipeline.errors import ConfigError
    from gen_pipeline.export.export import ExportConfig, export

    out = tmp_path / "out"
    sim = {"json_answers": True, "invalid": {"prose": 0.5}, "n_ports": 1}
    run_sim(write_jsonl(prompts(12)), out, sim=sim, validate=("json",), sampling={"seed": SEED}, max_resamples=1)
    done = {r["id"]: r for r in completions(out)}
    kept = rejects(out)
    stats = export(ExportConfig(runs=(out,), out=tmp_path / "ds", rejected=True))
    files = sorted(str(p) for p in (tmp_path / "ds" / "rejected").glob("*.parquet"))
    rows = datasets.load_dataset("parquet", data_files=files, split="train")
    assert len(rows) == len(kept) == stats.rejected and stats.rejected_with_chosen < stats.rejected
    for row, line in zip(rows, kept, strict=True):
        assert row["id"] == str(line["id"]) and row["attempt"] == line["attempt"] and row["check"] == "json"
        assert [t["content"] for t in row["prompt"]] == [m["content"] for m in line["messages"]]
        assert row["rejected"][0]["content"] == line["completion"] and row["rejected"][0]["role"] == "assistant"
        passed = done.get(line["id"])
        assert [t["content"] for t in row["chosen"]] == ([passed["completion"]] if passed else [])
    assert stats.rejected_with_chosen == sum(line["id"] in done for line in kept)
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "- config_name: rejected" in card and f"| rejected answers (rejected/, --rejected) | {len(kept)} |" in card
    with pytest.raises(ConfigError, match="--rejected"):
        ExportConfig(runs=(out,), out=tmp_path / "c", rejected=True, format="conversations")


def test_a_loop_stopped_on_the_way_is_kept_short_and_resampled(write_jsonl, tmp_path, monkeypatch):
    """Any RejectedAnswerError out of the request (the loop guard's DegenerateAnswerError) is kept, its looping
    text cut to the head and its unit, resampled with the next seed, and never counted against the server;
    rejected every time, the row is ledgered `degenerate`."""
    from gen_pipeline.errors import DegenerateAnswerError
    from gen_pipeline.http import Client

    rows = prompts(8)
    first = {answer_seed(SEED, r["id"], 0, 0, 0) for r in rows}
    always = {"on": False}
    real = Client.chat

    async def chat(self: Client, server: str, payload: dict[str, Any], timeout: float, watch: Any = None) -> Any:
        if payload.get("seed") in first or (always["on"] and payload.get("max_tokens", 0) > 1):
            raise DegenerateAnswerError(
                "a repetition loop in the content", check="loop", content="Start. " + "and again, " * 500,
                completion_tokens=700, finish_reason="abort",
            )  # fmt: skip
        return await real(self, server, payload, timeout, watch)

    monkeypatch.setattr(Client, "chat", chat)
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, sim={"n_ports": 2}, sampling={"seed": SEED})
    kept = rejects(out)
    assert len(kept) == 8 and {(r["reason"], r["check"], r["attempt"]) for r in kept} == {("degenerate", "loop", 0)}
    assert all(r["completion"].startswith("Start. and again, and again,") and "[... " in r["completion"] for r in kept)
    assert all(len(r["completion"]) < 120 and r["completion_tokens"] == 700 for r in kept)
    assert outcome.summary["completed"] == 8 and all(r["rejected"] == 1 for r in completions(out))
    assert outcome.summary["answers"]["rejected"] == {"degenerate": 8}
    assert outcome.summary["answers"]["rejected_tokens"] == 8 * 700
    servers = outcome.summary["servers"].values()
    assert all(not s["failures"] for s in servers) and sum(s["rejected"]["degenerate"] for s in servers) == 8
    always["on"] = True
    loops, _ = run_sim(write_jsonl(prompts(3), "more.jsonl"), tmp_path / "loops", sim={"n_ports": 1})
    assert loops.summary["failed"] == {"degenerate": 3} and loops.exit_code == 0
    assert {f["reason"] for f in ledger(tmp_path / "loops")} == {"degenerate"}
