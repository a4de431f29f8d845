"""The loop guard's detector: it stops loops (a span repeated, n-gram diversity collapsing) within a few
thousand characters of their start, and leaves legitimately repetitive answers alone (bench/repetitive.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gen_pipeline.answers import loops
from gen_pipeline.answers.loops import (
    CHECK_EVERY,
    MIN_COPIES,
    MIN_SPAN,
    WINDOW,
    LoopDetector,
    LoopGuard,
    repeated_tail,
)
from gen_pipeline.errors import DegenerateAnswerError

TOKEN = 4  # characters a streamed piece carries, about a token's


def fixtures() -> ModuleType:
    """bench/repetitive.py (a script, not a package module)."""
    bench = str(Path(__file__).resolve().parents[1] / "bench")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module("repetitive")
    finally:
        sys.path.remove(bench)


LEGIT = fixtures().legit_answers(seed=0, count=400)
LOOPS = fixtures().loop_answers(seed=0, count=200)


def fired_at(text: str, piece: int = TOKEN) -> int | None:
    """Where (in characters fed) the detector first finds a loop in `text` streamed in pieces, or None."""
    detector = LoopDetector()
    for i in range(0, len(text), piece):
        if detector.feed(text[i : i + piece]) is not None:
            return i + piece
    return None


def test_the_fixture_sets_are_large_and_varied() -> None:
    """At least 300 legitimate answers of 25 kinds, and loops of 10 kinds, some after a good answer."""
    assert len(LEGIT) >= 300 and len({a["kind"] for a in LEGIT}) >= 25
    assert len({a["kind"] for a in LOOPS}) == 10 and any(a["loop_start"] for a in LOOPS)
    assert {a["part"] for a in LOOPS} == {"content", "reasoning_content"}


@pytest.mark.parametrize("kind", sorted({a["kind"] for a in LEGIT}))
def test_no_legitimately_repetitive_answer_is_stopped(kind: str) -> None:
    """Numbered lists to 200, counting, CSV and Markdown tables, code with repeated lines, songs with a chorus
    (99 bottles, the twelve days), tables of zeros, "say it ten times", logs: none is taken for a loop."""
    stopped = [a["text"][:80] for a in LEGIT if a["kind"] == kind and fired_at(a["text"]) is not None]
    assert stopped == []


@pytest.mark.parametrize("kind", sorted({a["kind"] for a in LOOPS}))
def test_every_loop_is_stopped_soon_after_it_starts(kind: str) -> None:
    """A sentence, a word, a paragraph of up to 1,500 characters, code, a list item, a table row, a drifting
    loop, two sentences in turn, reasoning's "wait", CJK: each found within a few thousand characters of where
    its loop starts (a loop runs to max_tokens: tens of thousands)."""
    for answer in (a for a in LOOPS if a["kind"] == kind):
        at = fired_at(answer["text"])
        assert at is not None, answer["text"][:200]
        assert answer["loop_start"] < at <= answer["loop_start"] + MIN_COPIES * 1500 + 2 * CHECK_EVERY


PARAGRAPH = " ".join(f"word{i}" for i in range(80)) + "\n"  # 571 characters, no shorter period


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("ab" * 600, ("ab", 2)),
        ("intro. " + "the cat sat. " * 100, ("the cat sat. ", 13)),
        ("x" * 999, None),  # under MIN_SPAN
        ("the end " * 40, None),
        (PARAGRAPH * 2, None),  # two copies of a long unit: a chorus sung twice
        (PARAGRAPH * 3, (PARAGRAPH, len(PARAGRAPH))),  # three copies of it: a loop
    ],
    ids=["tiny-period", "sentence", "too-short", "short-span", "two-copies", "three-copies"],
)
def test_repeated_tail_finds_the_shortest_unit(text: str, found: tuple[str, int] | None) -> None:
    """The unit repeated at the tail, over max(MIN_SPAN, MIN_COPIES x unit) characters; None short of that."""
    result = repeated_tail(text)
    if found is None:
        assert result is None
        return
    assert result is not None and len(result.unit) == found[1] and result.sign == "repeat"
    assert result.unit.endswith(found[0]) and result.span >= max(MIN_SPAN, MIN_COPIES * found[1])


def test_a_drifting_loop_is_found_by_its_ngrams() -> None:
    """A sentence repeated with a word changed every few copies has no exact period long enough; the
    diversity of its word 4-grams collapses."""
    words = ["so", "the", "value", "of", "x", "is", "four", "and", "the", "value", "of", "y", "is", "four"]
    text = " ".join(" ".join(w if (i % 7 or j != 3) else f"v{i}" for j, w in enumerate(words)) for i in range(200))
    detector = LoopDetector()
    findings = [f for i in range(0, len(text), TOKEN) if (f := detector.feed(text[i : i + TOKEN]))]
    assert findings and findings[0].sign == "diversity" and "0%" not in findings[0].describe()


def test_looking_costs_a_bounded_tail_not_the_whole_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 characters in 4-character pieces: one look per CHECK_EVERY characters, each at a tail of at
    most WINDOW characters (never the whole text)."""
    looked: list[int] = []

    def spy(text: str) -> Any:
        looked.append(len(text))
        return None

    monkeypatch.setattr(loops, "repeated_tail", spy)
    text = "".join(f"line {i} of a long answer\n" for i in range(5000))[:100_000]
    detector = LoopDetector()
    for i in range(0, len(text), TOKEN):
        detector.feed(text[i : i + TOKEN])
    assert len(looked) <= len(text) // CHECK_EVERY + 1 and max(looked) == WINDOW


def test_the_guard_stops_the_choice_that_loops_with_what_it_decoded() -> None:
    """Fed as the client feeds it, the guard raises DegenerateAnswerError (reason "degenerate", check "loop")
    with the looping choice's content and reasoning so far, its chunks as completion_tokens, and the server."""
    guard = LoopGuard("http://s:1")
    guard(0, "", "Let me think.")
    guard(1, "A fine answer.", "")
    with pytest.raises(DegenerateAnswerError) as caught:
        for _ in range(1000):
            guard(0, "", " I should check again.")
    error = caught.value
    assert error.reason == "degenerate" and error.check == "loop" and error.server == "http://s:1"
    assert error.content == "" and error.reasoning is not None and error.reasoning.startswith("Let me think. I should")
    assert error.completion_tokens == 1 + error.reasoning.count(" I should") and error.finish_reason == "abort"
    assert "loop in the reasoning_content" in str(error) and "repeated" in str(error)
    with pytest.raises(DegenerateAnswerError, match="loop in the content of choice 1"):
        for _ in range(1000):
            guard(1, " Again and again.", "")
