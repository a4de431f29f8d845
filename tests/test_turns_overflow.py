"""--turns all: a turn the server refuses for good (a context 400 that no smaller budget fixes) ends its
conversation as `context_overflow` at that turn, exactly once, and a resume leaves it ended.

The simulated servers count `EXTRA` template tokens more than the client does (a server-side template the
client does not know), so the client's exact count lets the turn go out and the server's count is over
its context. The long conversation's turns count 91, 205, 306, 403, ... tokens on the client (the tiny
tokenizer, `completion_words` 4 and max_tokens 32 keep the answers short): turns 0-2 fit the server's
count too, turn 3 (403 + 100 = 503) does not. A turn the client can tell will be refused (at the servers'
input cap) is not sent at all: over_length.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import conversation_rows, read_jsonl, run_sim

from gen_pipeline.config import DEFAULT_MIN_TOKENS, DEFAULT_SAFETY_MARGIN
from gen_pipeline.send.turns import split_turns

EXTRA = 100  # template tokens the servers count and the client does not
TURNS = 8  # the long conversation's user turns
ENDS_AT = 3  # the long conversation's first turn that the servers' count puts over their context
SAMPLES = 2
MAX_TOKENS = 32

# context 475: the server's count of turn 3 (503) is over the context itself (SGLang's check A). context 520:
# the input fits, but input and --min-tokens do not (check B; the budget the 400's numbers leave is 1 token).
SETTINGS = {
    "input-over-context": {"context_length": 475},
    "no-room-for-min-tokens": {"context_length": 520},
}


def long_conversation() -> dict[str, Any]:
    turns = ({"role": "user", "content": f"turn {t} " + "word " * 15} for t in range(TURNS))
    return {"id": "long", "messages": [m for u in turns for m in (u, {"role": "assistant", "content": "old"})]}


def sim_settings(context_length: int, log: Path) -> dict[str, Any]:
    return {"n_ports": 2, "context_length": context_length, "template_extra_tokens": EXTRA,
            "completion_words": 4, "request_log": str(log)}  # fmt: skip


def places(out: Path) -> Counter[tuple[str, int, int]]:
    return Counter((str(r["id"]), r["sample"], r["turn"]) for r in read_jsonl(out / "completions.jsonl"))


def asked_turns(log: Path, first: str) -> list[int]:
    """The turn of each answered request whose first user turn is `first` (turn k carries k + 1 user turns)."""
    users = [[m for m in e["messages"] if m["role"] == "user"] for e in read_jsonl(log)]
    return sorted(len(u) - 1 for u in users if u and u[0]["content"] == first)


@pytest.mark.parametrize("refusal", list(SETTINGS), ids=list(SETTINGS))
def test_a_turn_no_budget_fixes_ends_the_conversation_once(write_jsonl, tmp_path, refusal):
    """Turn 3 of each sample is ledgered context_overflow with its turn number after one refused attempt;
    turns 0-2 are written once, nothing after turn 3 is asked or written; the other conversations are
    complete; the summary says two ended early, at turn 3; a resume (with or without the input cursor)
    sends nothing and writes nothing."""
    ctx = SETTINGS[refusal]["context_length"]
    rows = [long_conversation(), *conversation_rows(3)]
    path, out, log = write_jsonl(rows), tmp_path / "out", tmp_path / "requests.jsonl"
    run = {"turns": "all", "samples": SAMPLES, "max_tokens": MAX_TOKENS}
    outcome, _ = run_sim(path, out, sim=sim_settings(ctx, log), **run)
    assert outcome.exit_code == 0, outcome.summary

    # The ledger: each sample of the long conversation at turn ENDS_AT, context_overflow from a 400 the
    # server gave (the client's own count let it out: it is no over_length).
    ledger = read_jsonl(out / "failures.jsonl")
    assert sorted((f["id"], f["sample"], f["turn"], f["reason"]) for f in ledger) == [
        ("long", s, ENDS_AT, "context_overflow") for s in range(SAMPLES)
    ]
    for f in ledger:
        assert f["status"] == 400 and f["attempts"] == 1, f
        assert f["input_tokens"] + DEFAULT_SAFETY_MARGIN + DEFAULT_MIN_TOKENS <= ctx, f  # it was sendable
        assert f"{f['input_tokens'] + EXTRA} tokens" in f["detail"], f  # refused on the server's count

    # The output: turns before ENDS_AT once each, none after it; every other conversation complete, once.
    done = places(out)
    assert set(done.values()) == {1}, [k for k, n in done.items() if n > 1]
    assert sorted((s, t) for (i, s, t) in done if i == "long") == [
        (s, t) for s in range(SAMPLES) for t in range(ENDS_AT)
    ]
    others = {(r["id"], s, t) for r in rows[1:] for s in range(SAMPLES) for t in range(len(split_turns(r["messages"])))}
    assert {k for k in done if k[0] != "long"} == others
    first = long_conversation()["messages"][0]["content"]
    assert asked_turns(log, first) == sorted(list(range(ENDS_AT)) * SAMPLES)  # nothing answered past it
    assert outcome.summary["requests"] == sum(done.values()) + SAMPLES  # one refused attempt a sample, no more

    # The summary, as returned and as written: how many ended early, and at which turn.
    conversations = {"complete": 3 * SAMPLES, "ended_early": SAMPLES, "ended_at_turn": {str(ENDS_AT): SAMPLES}}
    assert outcome.summary["conversations"] == conversations
    assert orjson.loads((out / "summary.json").read_bytes())["conversations"] == conversations

    # A resume sends nothing (the ended conversations are settled) and writes nothing again.
    written = {name: (out / name).read_bytes() for name in ("completions.jsonl", "failures.jsonl")}
    asked = len(read_jsonl(log))
    again, _ = run_sim(path, out, sim=sim_settings(ctx, log), **run)
    assert again.exit_code == 0, again.summary
    assert again.summary["requests"] == 0 and sum(again.summary["skipped"].values()) == len(rows)
    assert len(read_jsonl(log)) == asked
    assert {name: (out / name).read_bytes() for name in written} == written
    # Without the input cursor (as after a crash) each turn's key is looked up: the ended turn's ledger
    # entry settles its conversation.
    shutil.rmtree(out / ".index")
    again, _ = run_sim(path, out, sim=sim_settings(ctx, log), **run)
    assert again.exit_code == 0, again.summary
    assert again.summary["requests"] == 0 and again.summary["skipped"] == {"context_overflow": 1, "done": 3}
    assert len(read_jsonl(log)) == asked
    assert {name: (out / name).read_bytes() for name in written} == written


def test_a_turn_at_the_servers_input_cap_is_over_length_unsent(write_jsonl, tmp_path):
    """Turns are clamped like any prompt, the fleet's input cap too (SGLang's max_req_input_len, here 399
    from a KV pool of 405 tokens): turn 3 (403 tokens) is ledgered over_length without being sent, as the
    same prompt in a plain run is (turns were budgeted without the cap: the turn was sent and refused with
    SGLang's 'Input length ... exceeds the maximum allowed length' 400, context_overflow)."""
    rows = [long_conversation(), *conversation_rows(3)]
    path, out, log = write_jsonl(rows), tmp_path / "out", tmp_path / "requests.jsonl"
    sim = {**sim_settings(2000, log), "template_extra_tokens": 0, "max_total_tokens": 405}
    outcome, _ = run_sim(path, out, sim=sim, turns="all", samples=SAMPLES, max_tokens=MAX_TOKENS)
    assert outcome.exit_code == 0, outcome.summary
    ledger = read_jsonl(out / "failures.jsonl")
    assert sorted((f["id"], f["sample"], f["turn"], f["reason"]) for f in ledger) == [
        ("long", s, ENDS_AT, "over_length") for s in range(SAMPLES)
    ]
    assert all("refuse inputs of 399 tokens" in f["detail"] and f["attempts"] == 0 for f in ledger), ledger
    done = places(out)
    assert set(done.values()) == {1} and sorted(t for (i, _, t) in done if i == "long") == sorted(
        list(range(ENDS_AT)) * SAMPLES
    )
    assert outcome.summary["requests"] == sum(done.values())  # the refused turns were never sent
    assert outcome.summary["conversations"]["ended_at_turn"] == {str(ENDS_AT): SAMPLES}
