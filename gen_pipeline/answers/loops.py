"""The loop guard: degenerate repetition found at the tail of an answer while it streams, and the answer stopped.

Reasoning models (Qwen3 at low temperature among them) sometimes fall into a loop that runs to max_tokens. The
detector looks at the tail of the text as it grows, for two signs:
- a span repeated: the last MIN_SPAN characters or more are one unit over and over, at least MIN_COPIES times
  (a loop of any period up to WINDOW / MIN_COPIES characters: a word, a sentence, a paragraph);
- collapsing n-gram diversity: of the last NGRAM_WINDOW word n-grams, fewer than MIN_DISTINCT of them are
  distinct (a loop that drifts: a word changed here and there).
Legitimately repetitive answers stay under both: a count or a numbered list has a new number in every n-gram
and no period; a table's rows, a chorus, repeated code lines repeat a few times or over short spans. The
figures are set on the fixture set of bench/repetitive.py (400 legitimate answers, none stopped; the
loops all found within a few hundred tokens of their start: bench/loops.py).

Cost: text arrives in pieces; the detector looks once every CHECK_EVERY new characters, at a tail of at most
WINDOW characters (str.rfind and slice comparisons, done in C), and keeps a running count of n-grams: per
token O(1) amortized, never O(text).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..errors import DegenerateAnswerError

# a span repeated
MIN_SPAN = 1000  # characters the repetition must cover (all its copies together)
MIN_COPIES = 3  # copies of the unit at least, in those characters
WINDOW = 8192  # characters of the tail kept and searched: periods up to WINDOW / MIN_COPIES
PROBE = 24  # the last characters whose earlier occurrences give the candidate periods
CANDIDATES = 8  # candidate periods tried per look, nearest first
CHECK_EVERY = 64  # new characters between two looks
# collapsing n-gram diversity
NGRAM = 4
NGRAM_WINDOW = 256
MIN_DISTINCT = 0.2  # of NGRAM_WINDOW


@dataclass(frozen=True, slots=True)
class Finding:
    """A loop found: what repeats, how often, over how many characters."""

    sign: str  # "repeat" (a span repeated) or "diversity" (collapsing n-gram diversity)
    unit: str  # the repeated span (sign "repeat"), or the most frequent n-gram
    copies: float  # copies of the unit over `span` (for "diversity": distinct n-grams per window)
    span: int  # characters covered

    def describe(self) -> str:
        """One line for a reject's reason."""
        unit = self.unit if len(self.unit) <= 60 else self.unit[:57] + "..."
        if self.sign == "repeat":
            return f"{unit!r} ({len(self.unit)} characters) repeated {self.copies:.0f} times over {self.span}"
        return f"{self.copies:.0%} of the last {NGRAM_WINDOW} word {NGRAM}-grams distinct (most: {unit!r})"


def repeated_tail(text: str) -> Finding | None:
    """The shortest unit the tail of `text` repeats over max(MIN_SPAN, MIN_COPIES x unit) characters, if any.

    The candidate periods are the distances back to the earlier occurrences of the last PROBE characters,
    nearest first; each is checked by comparing the tail with itself shifted by the period.
    """
    n = len(text)
    if n < MIN_SPAN:
        return None
    probe, end = text[-PROBE:], n - 1
    for _ in range(CANDIDATES):
        at = text.rfind(probe, 0, end)
        if at < 0:
            return None
        period = n - PROBE - at
        span = max(MIN_SPAN, MIN_COPIES * period)
        if span > n:
            return None  # the later candidates are longer still
        if text[n - span + period :] == text[n - span : n - period]:
            return Finding("repeat", text[n - period :], span / period, span)
        end = at + PROBE - 1
    return None


class NgramWindow:
    """The last NGRAM_WINDOW word n-grams of a text fed in pieces, counted as they come and go."""

    def __init__(self) -> None:
        self.carry = ""  # a word cut at the end of the last piece
        self.words: deque[str] = deque(maxlen=NGRAM_WINDOW + NGRAM - 1)
        self.last: list[str] = []  # the last NGRAM - 1 words, which begin the next n-grams
        self.grams: deque[tuple[str, ...]] = deque()
        self.counts: dict[tuple[str, ...], int] = {}

    def feed(self, text: str) -> None:
        words = (self.carry + text).split()
        self.carry = words.pop() if words and not text[-1:].isspace() else ""
        self.words.extend(words)
        seq = self.last + words
        self.last = seq[-(NGRAM - 1) :]
        if len(seq) < NGRAM:
            return
        grams = list(zip(*(seq[i : len(seq) - NGRAM + 1 + i] for i in range(NGRAM)), strict=True))
        counts, window = self.counts, self.grams
        for gram in grams:
            counts[gram] = counts.get(gram, 0) + 1
        window.extend(grams)
        while len(window) > NGRAM_WINDOW:
            old = window.popleft()
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]

    def collapsed(self) -> Finding | None:
        """A Finding when the window is full and few of its n-grams are distinct."""
        if len(self.grams) < NGRAM_WINDOW or len(self.counts) >= MIN_DISTINCT * NGRAM_WINDOW:
            return None
        chars = sum(map(len, self.words)) + len(self.words)
        top = max(self.counts, key=self.counts.__getitem__)
        return Finding("diversity", " ".join(top), len(self.counts) / NGRAM_WINDOW, chars)


class LoopDetector:
    """Watches one text (a choice's content, or its reasoning) as it grows; `feed` returns a Finding at a loop."""

    def __init__(self) -> None:
        self._tail = ""
        self._pending: list[str] = []
        self._fresh = 0
        self._ngrams = NgramWindow()

    def feed(self, text: str) -> Finding | None:
        """Add the next piece; look for a loop when CHECK_EVERY characters came since the last look."""
        self._pending.append(text)
        self._fresh += len(text)
        if self._fresh < CHECK_EVERY:
            return None
        new = "".join(self._pending)
        self._pending.clear()
        self._fresh = 0
        self._tail = (self._tail + new)[-WINDOW:]
        self._ngrams.feed(new)
        return repeated_tail(self._tail) or self._ngrams.collapsed()


@dataclass
class _Watched:
    """One choice: its text so far, and a detector for its content and one for its reasoning."""

    parts: dict[str, list[str]] = field(default_factory=lambda: {"content": [], "reasoning_content": []})
    detectors: dict[str, LoopDetector] = field(
        default_factory=lambda: {"content": LoopDetector(), "reasoning_content": LoopDetector()}
    )
    chunks: int = 0


class LoopGuard:
    """The loop guard on one attempt (an http Watch): the first loop found in any choice's content or reasoning
    stops the answer with DegenerateAnswerError, carrying what that choice had decoded."""

    def __init__(self, server: str = "") -> None:
        self.server = server
        self._choices: dict[int, _Watched] = {}

    def __call__(self, index: int, content: str, reasoning: str) -> None:
        watched = self._choices.get(index)
        if watched is None:
            watched = self._choices[index] = _Watched()
        watched.chunks += 1
        for part, text in (("reasoning_content", reasoning), ("content", content)):
            if text:
                watched.parts[part].append(text)
                found = watched.detectors[part].feed(text)
                if found is not None:
                    raise self._stopped(index, part, found, watched)

    def _stopped(self, index: int, part: str, found: Finding, watched: _Watched) -> DegenerateAnswerError:
        content = "".join(watched.parts["content"])
        reasoning = "".join(watched.parts["reasoning_content"]) or None
        where = f"the {part}" + (f" of choice {index}" if index else "")
        return DegenerateAnswerError(
            f"a repetition loop in {where}, stopped after {watched.chunks} chunks: {found.describe()}",
            check="loop",
            server=self.server,
            content=content,
            reasoning=reasoning,
            completion_tokens=watched.chunks,
            finish_reason="abort",
        )
