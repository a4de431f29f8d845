"""A server's usage is judged before it is believed: impossible counts are flagged per server and kept out of
every figure, while the answer itself stays data."""

from __future__ import annotations

import pytest
from e2e import check_invariant, prompts, read_jsonl
from test_answers import generate

from gen_pipeline.http import ChatResult
from gen_pipeline.send.usage import usage_problem

LIAR = {"message": {"content": "a fine answer"}, "usage": {"prompt_tokens": 20, "completion_tokens": 50046}}


def test_impossible_usage_is_flagged_and_left_out_of_the_totals(write_jsonl, tmp_path):
    """Issue 29: a server reporting completion_tokens 50,046 for max_tokens 32. Its answers are written with
    null counts, the server's report and the reason; the run's output tokens are the other server's alone,
    and the summary counts and names the server."""
    rows = prompts(40)
    out = tmp_path / "out"
    outcome = generate(write_jsonl(rows), out, [LIAR], max_tokens=32)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 40
    lines = read_jsonl(out / "completions.jsonl")
    liar = list(outcome.summary["servers"])[-1]
    flagged = [r for r in lines if r["server"] == liar]
    good = [r for r in lines if r["server"] != liar]
    assert flagged and good
    assert all(r["completion"] == "a fine answer" and r["completion_tokens"] is None for r in flagged)
    assert all(r["prompt_tokens"] is None and r["server_usage"]["completion_tokens"] == 50046 for r in flagged)
    assert all("completion_tokens 50046 > max_tokens 32" in r["usage_invalid"] for r in flagged)
    assert not any("usage_invalid" in r for r in good)
    assert outcome.summary["output_tokens"] == sum(r["completion_tokens"] for r in good)
    assert outcome.summary["servers"][liar]["impossible_usage"] == len(flagged)
    assert outcome.summary["servers"][liar]["output_tokens"] == 0
    assert any(
        w.startswith(f"{liar}: {len(flagged)} answer(s) reported impossible usage") for w in outcome.summary["warnings"]
    )
    assert outcome.summary["token_drift"]["compared"] == len(good)
    check_invariant([r["id"] for r in rows], out)


def _result(prompt: int | None = 100, used: int | None = 10, thinking: int | None = None) -> ChatResult:
    return ChatResult("x", "stop", prompt, used, reasoning_tokens=thinking)


@pytest.mark.parametrize(
    ("result", "n", "problem"),
    [
        (_result(), 1, None),
        (_result(used=64), 1, None),  # exactly max_tokens: cut at the budget
        (_result(used=65), 1, "completion_tokens 65 > max_tokens 64"),
        (_result(used=128), 2, None),  # a request with n: the samples' tokens together
        (_result(used=129), 2, "completion_tokens 129 > max_tokens 64 x n 2"),
        (_result(used=-1), 1, "completion_tokens -1 is negative"),
        (_result(prompt=-5), 1, "prompt_tokens -5 is negative"),
        (_result(used=10, thinking=11), 1, "reasoning_tokens 11 > completion_tokens 10"),
        (_result(prompt=9000), 1, "prompt_tokens 9000 > the context length 8192"),
        (_result(prompt=1300), 1, "prompt_tokens 1300 against our exact count 100"),
        (_result(prompt=1224), 1, None),  # a template or reserve our count missed: drift, not impossible
        (_result(prompt=None, used=None), 1, None),  # no usage at all: nothing to judge
    ],
)
def test_usage_problem_table(result, n, problem):
    """What counts as impossible for an answer to n choices of max_tokens 64, our count 100, context 8192."""
    assert usage_problem(result, 64, n, 100, 8192) == problem
