"""generate end to end against the simulated SGLang fleet, in-process, over real sockets."""

from __future__ import annotations

import orjson
import pytest
from e2e import check_invariant, prompts, read_jsonl, run_sim

from gen_pipeline.errors import ManifestMismatchError
from gen_pipeline.resume.ledger import ledger_reasons


def test_all_rows_complete_and_balance(write_jsonl, tmp_path):
    """Every row completes once; the load spreads over all eight servers; counts match."""
    rows = prompts(400)
    out = tmp_path / "out"
    outcome, fleet = run_sim(write_jsonl(rows), out)
    assert outcome.exit_code == 0
    assert check_invariant([r["id"] for r in rows], out) == {"done": 400, "ledger": 0}
    served = [s.completions for s in fleet.stats.values()]
    assert sum(served) == 400 and min(served) >= 25, served
    lines = read_jsonl(out / "completions.jsonl")
    assert all(r["prompt_tokens"] == r["input_tokens"] for r in lines)  # exact count, zero drift
    assert outcome.summary["token_drift"]["differed"] == 0
    first = lines[0]
    for field in (
        "id",
        "messages",
        "completion",
        "finish_reason",
        "input_tokens",
        "prompt_tokens",
        "completion_tokens",
        "max_tokens",
        "server",
        "attempts",
        "latency_s",
        "time",
        "model",
        "meta",
    ):
        assert field in first
    assert (out / "summary.json").exists() and (out / "manifest.json").exists()


def test_over_length_rows_are_never_sent(write_jsonl, tmp_path):
    """Prompts with no room left go to the ledger with their counts and cost no request."""
    rows = prompts(30) + [{"id": f"long{i}", "prompt": "word " * 3000} for i in range(3)]
    out = tmp_path / "out"
    outcome, fleet = run_sim(write_jsonl(rows), out, {"context_length": 2048})
    assert outcome.exit_code == 0
    ledger = read_jsonl(out / "failures.jsonl")
    assert sorted(r["id"] for r in ledger) == ["long0", "long1", "long2"]
    assert all(r["reason"] == "over_length" and r["input_tokens"] > 2048 for r in ledger)
    assert sum(s.requests for s in fleet.stats.values()) == 30
    assert max(s.max_prompt_tokens for s in fleet.stats.values()) < 2048


def test_max_tokens_equal_to_context_is_clamped(write_jsonl, tmp_path):
    """max_tokens = context (the classic every-request-400s mistake) is clamped, nothing fails."""
    rows = prompts(50)
    out = tmp_path / "out"
    outcome, fleet = run_sim(write_jsonl(rows), out, {"context_length": 1024}, max_tokens=1024)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 50
    assert sum(s.errors for s in fleet.stats.values()) == 0
    for r in read_jsonl(out / "completions.jsonl"):
        assert r["input_tokens"] + r["max_tokens"] <= 1024 - 16


@pytest.mark.parametrize("legacy", [False, True])
def test_uncounted_template_tokens_recovered_by_400_parse(write_jsonl, tmp_path, legacy):
    """A server whose template adds 40 uncounted tokens 400s near the limit; the parse fixes it."""
    rows = prompts(40)
    out = tmp_path / "out"
    outcome, _ = run_sim(
        write_jsonl(rows),
        out,
        {"context_length": 512, "template_extra_tokens": 40, "legacy_offbyone": legacy},
        max_tokens=512,
    )
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 40
    lines = read_jsonl(out / "completions.jsonl")
    assert any(r["attempts"] == 2 for r in lines)
    assert all(r["prompt_tokens"] + r["max_tokens"] <= 512 for r in lines)
    assert outcome.summary["token_drift"]["by_offset"] == {"40": 40}
    assert any("not the server's" in w for w in outcome.summary["warnings"])


def test_speculative_reserve_is_learned(write_jsonl, tmp_path):
    """SGLang's EAGLE reserve in its 400 counts is learned after a few rows, then budgeted."""
    rows = prompts(200)
    out = tmp_path / "out"
    outcome, fleet = run_sim(
        write_jsonl(rows),
        out,
        {"context_length": 512, "reserved_tokens": 24},
        max_tokens=512,
        concurrency=1,
    )
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 200
    assert outcome.summary["learned_offset"] == 24
    overflow_400s = sum(s.length_errors for s in fleet.stats.values())
    assert 3 <= overflow_400s < 20  # paid a few times, not on every row


def test_bad_rows_ledgered_once_across_reruns(write_jsonl, tmp_path):
    """Bad rows get one ledger line each; a rerun neither re-ledgers nor re-sends anything."""
    twice = b'{"id": "t", "prompt": "which id?", "id": "u"}'  # sent as "u" once, it came back on every rerun
    huge = b'{"id": 123456789012345678901234567890, "prompt": "x"}'  # its ledger line crashed the run
    rows = [*prompts(5), b"{broken", {"id": "e", "messages": []}, {"id": 1, "prompt": "conflict"}, twice, huge]
    path, out = write_jsonl(rows), tmp_path / "out"
    first, _ = run_sim(path, out)
    assert first.summary["failed"] == {"bad_input": 5}
    second, fleet = run_sim(path, out)
    assert second.summary["completed"] == 0 and second.summary["failed"] == {}
    assert second.summary["skipped"] == {"done": 5, "bad_input": 5}
    assert sum(s.requests for s in fleet.stats.values()) == 0
    assert len(read_jsonl(out / "failures.jsonl")) == 5


def test_resume_skips_done_and_permanent_but_retries_transient(write_jsonl, tmp_path):
    """A rerun sends only rows that are not done and whose last failure was transient."""
    rows = prompts(10)
    path, out = write_jsonl(rows), tmp_path / "out"
    out.mkdir()
    # pretend an earlier run finished ids 0-3, failed 4 permanently and 5 transiently
    run_sim(write_jsonl(rows[:4], "first.jsonl"), out)
    with (out / "failures.jsonl").open("ab") as f:
        f.write(orjson.dumps({"id": 4, "reason": "bad_request", "line": 5}) + b"\n")
        f.write(orjson.dumps({"id": 5, "reason": "timeout", "line": 6}) + b"\n")
    outcome, fleet = run_sim(path, out)
    assert outcome.summary["skipped"] == {"done": 4, "bad_request": 1}
    assert outcome.summary["completed"] == 5
    assert sum(s.requests for s in fleet.stats.values()) == 5
    again, _ = run_sim(path, out, retry_failed=frozenset({"bad_request"}))
    assert again.summary["completed"] == 1
    check_invariant([r["id"] for r in rows], out)


def test_changed_settings_refused(write_jsonl, tmp_path):
    """Resuming with other sampling parameters is refused unless forced."""
    path, out = write_jsonl(prompts(3)), tmp_path / "out"
    run_sim(path, out, sampling={"temperature": 0.7})
    with pytest.raises(ManifestMismatchError, match="sampling"):
        run_sim(path, out, sampling={"temperature": 1.0})
    forced, _ = run_sim(path, out, sampling={"temperature": 1.0}, force=True)
    assert forced.exit_code == 0


def test_a_changed_budget_is_taken_and_said(write_jsonl, tmp_path):
    """Resuming with another --max-tokens is allowed (rows already written keep theirs; each line records it),
    and the summary says so; the manifest records the new value (it changed without a word)."""
    rows = prompts(6)
    path, out = write_jsonl(rows[:3]), tmp_path / "out"
    run_sim(path, out, max_tokens=64)
    path = write_jsonl(rows)
    again, _ = run_sim(path, out, max_tokens=32)
    assert again.exit_code == 0 and again.summary["completed"] == 3
    [said] = [w for w in again.summary["warnings"] if "--max-tokens 64 -> 32" in w]
    assert "each line the max_tokens it was sent with" in said
    assert orjson.loads((out / "manifest.json").read_bytes())["max_tokens"] == 32
    same, _ = run_sim(path, out, max_tokens=32)
    assert not [w for w in same.summary["warnings"] if "--max-tokens" in w]


def test_flaky_and_dead_servers_are_routed_around(write_jsonl, tmp_path):
    """A dead port and a flaky one cost retries, never rows; retries go to another server."""
    rows = prompts(300)
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out, {"n_ports": 4, "p500": 0.1, "seed": 3})
    assert outcome.exit_code == 0
    check_invariant([r["id"] for r in rows], out)
    lines = read_jsonl(out / "completions.jsonl")
    assert any(r["attempts"] > 1 for r in lines)
    assert max(r["attempts"] for r in lines) <= 6


def test_exhausted_transport_retries_are_transient_and_rerun(write_jsonl, tmp_path):
    """When every attempt fails the row is ledgered as transient (exit 3) and a rerun retries it."""
    rows = prompts(20)
    path, out = write_jsonl(rows), tmp_path / "out"
    outcome, _ = run_sim(path, out, {"n_ports": 4, "p500": 0.5, "seed": 1}, retry=_policy(1))
    failed = outcome.summary["failed"].get("server_error", 0)
    assert outcome.exit_code == 3 and 0 < failed < 20
    assert outcome.summary["completed"] + failed == 20
    again, _ = run_sim(path, out, {"n_ports": 2})
    assert again.exit_code == 0 and again.summary["completed"] == failed
    check_invariant([r["id"] for r in rows], out)


def _policy(attempts: int):
    from gen_pipeline.config import RetryPolicy

    return RetryPolicy.testing(max_attempts=attempts)


def test_rows_the_chat_template_refuses_become_bad_input(write_jsonl, tmp_path):
    """A conversation the template cannot render is a bad_input row; its batch neighbours are counted."""
    from conftest import FakeCounter

    from gen_pipeline.config import RunConfig
    from gen_pipeline.engine.reader import BatchReader
    from gen_pipeline.inputs.rows import BadRow
    from gen_pipeline.inputs.source import Skipped
    from gen_pipeline.progress.stats import RunStats
    from gen_pipeline.resume.settled import ResumeState

    class Refusing(FakeCounter):
        def count(self, conversations):
            counts = super().count(conversations)
            return [
                "template says no" if "refuse" in c[0]["content"] else n
                for c, n in zip(conversations, counts, strict=True)
            ]

    rows = [{"id": 1, "prompt": "a b c"}, {"id": 2, "prompt": "refuse me"}, {"id": 3, "prompt": "d"}]
    cfg = RunConfig(input=write_jsonl(rows), out=tmp_path / "o")
    batch, _ = BatchReader(cfg, Refusing(), ResumeState(), RunStats()).next_batch()
    assert [type(x).__name__ for x in batch] == ["Prompt", "BadRow", "Prompt"]
    assert isinstance(batch[1], BadRow) and batch[1].detail == "template says no" and batch[1].line == 2
    assert batch[0].input_tokens == 8 and batch[2].input_tokens == 6
    # the next run: the refusal is in the ledger, so the row is skipped, not ledgered a second time
    ledgered = ResumeState(bad_lines={(cfg.input.name, 2)})
    again, _ = BatchReader(cfg, Refusing(), ledgered, RunStats()).next_batch()
    assert [type(x).__name__ for x in again] == ["Skipped", "Prompt", "Prompt"]
    assert again[0] == Skipped("bad_input")


def test_pool_fits_the_open_file_limit(tmp_path):
    """Each request in flight holds a socket: a fleet that takes more than the open-file limit allows gets
    smaller shares (with a warning) instead of connections that fail and get blamed on the servers."""
    from gen_pipeline.config import RunConfig, parse_servers
    from gen_pipeline.engine.setup import RESERVED_FILES, build_pool
    from gen_pipeline.fleet.discovery import FleetInfo, ServerInfo

    servers = parse_servers("127.0.0.1:30000-30007")
    config = RunConfig(input=tmp_path / "in.jsonl", out=tmp_path / "out", servers=servers)

    def fleet():
        return FleetInfo([ServerInfo(url, "m", 8192, max_running_requests=128) for url in servers], [])

    roomy = fleet()
    assert [s.capacity for s in build_pool(config, roomy, open_files=65536).servers] == [128] * 8
    assert roomy.warnings == []
    tight = fleet()
    capacities = [s.capacity for s in build_pool(config, tight, open_files=512).servers]
    assert sum(capacities) <= 512 - RESERVED_FILES and min(capacities) >= 1 and len(set(capacities)) == 1
    assert "open-file limit (ulimit -n) is 512" in tight.warnings[0]


def test_reasoning_content_is_kept_and_exported(write_jsonl, tmp_path):
    """A server with a reasoning parser sends the thinking apart from content: it is written after the
    completion (only then), and `export --columns reasoning_content` carries it into the dataset."""
    import argparse

    import datasets

    from gen_pipeline.cli import export as cli_export

    path = write_jsonl(prompts(6))
    run_sim(path, tmp_path / "plain")
    assert all("reasoning_content" not in r for r in read_jsonl(tmp_path / "plain" / "completions.jsonl"))
    outcome, _ = run_sim(path, tmp_path / "think", sim={"reasoning_words": 6})
    assert outcome.summary["completed"] == 6
    lines = read_jsonl(tmp_path / "think" / "completions.jsonl")
    assert all(isinstance(r["reasoning_content"], str) and r["reasoning_content"] for r in lines)
    assert list(lines[0])[:5] == ["id", "sample", "messages", "completion", "reasoning_content"]
    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    argv = [str(tmp_path / "think"), "--out", str(tmp_path / "ds"), "--save-to-disk"]
    argv += ["--columns", "id,reasoning_content"]
    assert cli_export.main(parser.parse_args(argv)) == 0
    rows = {r["id"]: r["reasoning_content"] for r in datasets.load_from_disk(str(tmp_path / "ds"))}
    assert rows == {str(r["id"]): r["reasoning_content"] for r in lines}


def test_a_row_too_deep_to_write_is_ledgered_and_the_run_goes_on(write_jsonl, tmp_path):
    """A row nested 600 levels (read fine, unwritable by orjson) is bad_input; the rows after it complete."""
    deep = b'{"id": "deep", "prompt": "hi", "extra": ' + b"[" * 600 + b"]" * 600 + b"}"
    rows = [*prompts(3), deep, *prompts(3, start=3)]
    out = tmp_path / "out"
    outcome, _ = run_sim(write_jsonl(rows), out)
    assert outcome.exit_code == 0
    assert check_invariant([*range(6), "deep"], out) == {"done": 6, "ledger": 1}
    [entry] = read_jsonl(out / "failures.jsonl")
    assert entry["id"] == "deep" and entry["reason"] == "bad_input" and "nested" in entry["detail"]


def test_a_row_reusing_a_done_id_never_shadows_it(write_jsonl, tmp_path):
    """Rows appended with done ids and other content are bad_input under no id: by "the newest entry per
    (id, sample) decides", every done id still reads as done, and the ledger counts them once each."""
    rows = prompts(4)
    path, out = write_jsonl(rows), tmp_path / "out"
    assert run_sim(path, out)[0].exit_code == 0
    with path.open("ab") as f:
        f.write(b"".join(orjson.dumps({"id": i, "prompt": f"other {i}"}) + b"\n" for i in (0, 2, 3)))
    second, _ = run_sim(path, out)
    assert second.exit_code == 0 and second.summary["failed"] == {"bad_input": 3}
    ledger = read_jsonl(out / "failures.jsonl")
    assert [(e["id"], e["line"]) for e in ledger] == [(None, 5), (None, 6), (None, 7)]
    assert all("seen before with different content" in e["detail"] for e in ledger)
    assert ledger_reasons([out]) == {"bad_input": 3}
    assert check_invariant([r["id"] for r in rows], out) == {"done": 4, "ledger": 0}
