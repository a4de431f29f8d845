"""A looping answer, kept short: its head (everything before the loop) and a few copies of the repeated unit,
with a marker saying how much was left out. rejected.jsonl keeps a loop's text so (send/resample.py): what
led into the loop and what repeated are the evidence; the thousandth copy is not.
"""

from __future__ import annotations

from .loops import WINDOW, repeated_tail

KEEP_COPIES = 2  # copies of the repeated unit kept after the head


def loop_start(text: str, period: int) -> int:
    """Where the tail's repetition with this period begins: the first index from which the text repeats itself
    `period` characters later, to its end."""
    start = len(text) - period
    while start > 0 and text[start - 1] == text[start - 1 + period]:
        start -= 1
    return start


def shortened(text: str, keep: int = KEEP_COPIES) -> str:
    """`text` cut to its head and `keep` copies of the unit its tail repeats (unchanged when it does not loop,
    or when the loop is no longer than that)."""
    found = repeated_tail(text[-WINDOW:])
    if found is None:
        return text
    period = len(found.unit)
    cut = loop_start(text, period) + keep * period
    if cut >= len(text):
        return text
    return f"{text[:cut]}[... {len(text) - cut} more characters repeating the last {period} ...]"
