"""All token arithmetic, as tables: the clamp, the dispatch budget, re-budgeting after a 400, the learned offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from gen_pipeline.config import RunConfig
from gen_pipeline.errors import OverflowCounts
from gen_pipeline.tokens.budget import OffsetLearner, clamp_max_tokens, dispatch_budget, prompt_budget, rebudget

CTX = 8192


@pytest.mark.parametrize(
    ("requested", "input_tokens", "margin", "min_tokens", "expected"),
    [
        (256, 100, 16, 16, 256),  # fits: the request stands
        (8192, 100, 16, 16, CTX - 100 - 16),  # max_tokens = context: clamped
        (8192, 0, 0, 1, CTX),  # no margin, no input: the whole context
        (8192, 8191, 0, 1, 1),  # input + max_tokens = context exactly
        (8192, 8190, 1, 1, 1),  # input + max_tokens = context - 1, the safe client rule
        (8192, 8192, 0, 1, None),  # nothing left
        (256, 30000 - 22000 + 100, 16, 16, 76),  # clamped below the request
        (256, 8100, 16, 100, None),  # 76 of room is below min_tokens
        (256, 8100, 16, 76, 76),  # exactly min_tokens fits
    ],
)
def test_clamp_table(requested, input_tokens, margin, min_tokens, expected):
    """The budget is min(requested, context - input - margin), or None under min_tokens."""
    got = clamp_max_tokens(
        requested,
        context_length=CTX,
        input_tokens=input_tokens,
        margin=margin,
        min_tokens=min_tokens,
    )
    assert got == expected
    if got is not None:
        assert input_tokens + got + margin <= CTX


@pytest.mark.parametrize(
    ("input_tokens", "max_input", "expected"),
    [
        # under SGLang's max_req_input_len (context - 6): what its scheduler makes, max_req_len - 1 - input,
        # max_req_len being the cap + 5 (context - 1): 5, not the context's 7 (it trims the rest silently)
        (8185, 8186, 5),
        (8000, 8186, 190),  # the same 2 short of the context's 192 at any length
        (8186, 8186, None),  # at it: the scheduler refuses the prompt, though the context has room
        (8186, None, 6),  # no cap reported (vLLM, llama.cpp)
    ],
)
def test_the_servers_input_cap_is_kept(input_tokens, max_input, expected):
    """A prompt of max_req_input_len tokens or more gets no budget, whatever room the context leaves; below it,
    no more than the scheduler makes (a budget over that was recorded though no answer could reach it)."""
    got = clamp_max_tokens(
        256, context_length=CTX, input_tokens=input_tokens, margin=0, min_tokens=1, max_input=max_input
    )
    assert got == expected


@pytest.mark.parametrize(
    ("counts", "sent", "expected"),
    [
        # the server counted 8000 where we counted less: fit under its count
        (OverflowCounts("sglang.total", CTX, 8100, 176), 176, CTX - 8100 - 16),
        # legacy off-by-one: our budget fit by its own numbers; go one lower
        (OverflowCounts("sglang.total", CTX, 8000, 192), 192, 176),
        (OverflowCounts("sglang.input", CTX, 9000), 100, None),  # the prompt alone is too long
        (OverflowCounts("sglang.sched", None, 8190, max_input=8186), 1, None),
        (OverflowCounts("vllm.v018.total", 4096, 300, 4000, lower_bound=True), 4000, None),
        (OverflowCounts("no_counts"), 100, None),
        (OverflowCounts("sglang.total", CTX, CTX - 20, 100), 100, None),  # room below min_tokens
        (
            OverflowCounts("llamacpp.fields", 2048, 1000),
            4000,
            2048 - 1000 - 16,
        ),  # smaller server ctx
    ],
)
def test_rebudget_table(counts, sent, expected):
    """The new budget comes from the server's own counts, or None when none can fit."""
    assert rebudget(counts, sent_max_tokens=sent, context_length=CTX, margin=16, min_tokens=16) == expected


@pytest.mark.parametrize(
    ("counts", "counted", "expected"),
    [
        # SGLang 0.5.23: "max_completion_tokens is too large: 5000.This model supports at most 2048 ..."
        (OverflowCounts("sglang.maxtok", 2048, output_tokens=5000), 100, 2048 - 100 - 16),
        (OverflowCounts("vllm.maxtok_gt_ctx", 2048, output_tokens=5000), 100, 2048 - 100 - 16),
        (OverflowCounts("sglang.maxtok", 2048, output_tokens=5000), 2040, None),  # our count leaves no room
        (OverflowCounts("sglang.maxtok", 2048, output_tokens=5000), None, None),  # a size floor, not a count
        (OverflowCounts("no_counts"), 100, None),  # no context named: nothing to fit against
    ],
)
def test_rebudget_fits_an_error_without_the_input_count_with_ours(counts, counted, expected):
    """max_tokens alone over the server's context: the retry fits the context the error names, with our count."""
    got = rebudget(counts, sent_max_tokens=5000, context_length=100_000, margin=16, min_tokens=16, counted=counted)
    assert got == expected


def test_offset_is_learned_after_repeated_evidence():
    """The same positive gap three times becomes the offset; noise and lower bounds do not."""
    learner = OffsetLearner()
    gap = OverflowCounts("sglang.total", CTX, 1006, 10)
    learner.observe(1000, gap)
    learner.observe(500, OverflowCounts("sglang.total", CTX, 503, 10))
    learner.observe(900, OverflowCounts("x", CTX, 1900, lower_bound=True))
    learner.observe(1000, gap)
    assert learner.offset == 0
    learner.observe(2000, OverflowCounts("sglang.total", CTX, 2006, 10))
    assert learner.offset == 6
    learner.observe(10, OverflowCounts("sglang.total", CTX, 100000, 10))  # absurd: ignored
    assert learner.offset == 6


def config(**kw: int) -> RunConfig:
    return RunConfig(input=Path("in.jsonl"), out=Path("out"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "input_tokens", "row_max_tokens", "expected"),
    [
        ({}, 100, None, 2048),  # the default --max-tokens fits
        ({"max_tokens": 9000}, 100, None, CTX - 100 - 16),  # clamped by the context and the default margin
        ({}, 100, 64, 64),  # a row's own max_tokens wins
        ({"safety_margin": 0, "min_tokens": 1}, CTX - 1, None, 1),
        ({"min_tokens": 100}, CTX - 16 - 99, None, None),  # 99 of room is under --min-tokens
    ],
)
def test_prompt_budget_table(kw, input_tokens, row_max_tokens, expected):
    """prompt_budget is the clamp with the run's --max-tokens, --safety-margin and --min-tokens."""
    assert prompt_budget(config(**kw), CTX, input_tokens, row_max_tokens) == expected


@pytest.mark.parametrize(
    ("input_tokens", "offset", "expected"),
    [
        (100, 0, 2048),
        (CTX - 16 - 2048, 0, 2048),
        (CTX - 16 - 2048, 6, 2042),  # the learned offset counts against the room
        (
            CTX - 16 - 10,
            6,
            f"prompt has {CTX - 26} tokens (+6 learned offset); "
            f"context {CTX} - margin 16 leaves 4, below --min-tokens 16",
        ),
    ],
)
def test_dispatch_budget_table(input_tokens, offset, expected):
    """The budget at dispatch includes the learned offset; over length it is the ledger's detail text."""
    assert dispatch_budget(config(), CTX, input_tokens, None, offset) == expected


def test_with_no_margin_an_answer_at_the_edge_gets_every_token_it_was_budgeted(write_jsonl, tmp_path):
    """--safety-margin 0 against the simulated SGLang (its scheduler trims max_tokens to max_req_len - 1 -
    input): rows a few tokens from the context are budgeted what the server makes, so none is cut short of
    its recorded max_tokens (they were, by 2, with a warning blaming --context-length)."""
    from e2e import read_jsonl, run_sim

    rows = [{"id": i, "messages": [{"role": "user", "content": "x" * n}]} for i, n in enumerate((900, 980, 1000))]
    sim = {"n_ports": 1, "context_length": 1024, "completion_words": 100_000}
    outcome, _ = run_sim(write_jsonl(rows), tmp_path / "out", sim, max_tokens=200, safety_margin=0, min_tokens=4)
    lines = read_jsonl(tmp_path / "out" / "completions.jsonl")
    assert len(lines) == 3 and outcome.summary["token_drift"]["differed"] == 0
    assert all(r["completion_tokens"] == r["max_tokens"] < 200 for r in lines), lines
    assert not [w for w in outcome.summary["warnings"] if "before their max_tokens" in w]
