"""Rows that begin alike, read far apart: their shared prefill paid again.

A group is what `prepare --group-prefixes` writes together (records.group_digest): rows with the same tools
and the same messages up to the first user turn, as a conversation cut at each of its turns gives. A server's
prefix cache serves a group's shared messages only while it still holds them. Between two rows of one group,
the fleet is sent the prompts read in between; once those are more tokens than all the servers' prefix caches
hold together, the second row most likely finds the shared messages gone and its prefill is paid again
(bench/prefix.py (c): 1.97x the best prefill as shuffled, 1.12x grouped).

`Scatter` follows one group in SAMPLE, chosen by digest (a group is followed whole or not at all, so its
memory is a sixteenth of the groups'), keeps the prompt tokens read at each followed group's last row, and the
tokens read before each of their later rows came; `warning` counts those gaps against the fleet's caches.
Rows of one message are not followed (nothing before their first user turn: a deduplicated input has no two
alike), so short single-turn prompts cost nothing here; their tokens still count in the gaps.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from ..records import group_digest

SAMPLE = 16  # one group in this many is followed
MIN_FAR = 8  # followed rows that came far, at least, for the warning...
FAR_SHARE = 0.1  # ...and at least this share of the rows of more than one message (estimated)


@dataclass
class Scatter:
    """How far apart, in prompt tokens read, the input has the rows of one group (one group in SAMPLE)."""

    tokens: int = 0  # prompt tokens of the rows read so far
    rows: int = 0  # rows of more than one message read
    last: dict[bytes, int] = field(default_factory=dict)  # followed group -> `tokens` at its last row
    gaps: array[int] = field(default_factory=lambda: array("Q"))  # tokens read between followed rows of a group

    def note(self, messages: Any, tools: Any, tokens: int) -> None:
        """One row read (in input order), with its counted prompt tokens."""
        self.tokens += tokens
        if not isinstance(messages, list) or len(messages) < 2:
            return
        self.rows += 1
        digest = group_digest(messages, tools)
        if digest[0] % SAMPLE:
            return
        before = self.last.get(digest)
        if before is not None:
            self.gaps.append(self.tokens - tokens - before)
        self.last[digest] = self.tokens

    def far(self, cache_tokens: int) -> int:
        """Followed rows that came after more than `cache_tokens` of other prompts since their group's last."""
        return sum(1 for gap in self.gaps if gap > cache_tokens)

    def warning(self, cache_tokens: int) -> str | None:
        """What summary.json and check say when many rows come after more prompt tokens than the fleet's prefix caches
        hold together (`cache_tokens`) since the last row that begins like them."""
        far = self.far(cache_tokens)
        estimate = far * SAMPLE
        if far < MIN_FAR or estimate < FAR_SHARE * self.rows:
            return None
        return (
            f"about {estimate:,} of the {self.rows:,} rows of more than one message are read after more than "
            f"{cache_tokens:,} prompt tokens of other rows (all the servers' prefix caches together) since the "
            "last row that begins like them: by then the caches have most likely let their shared messages go, "
            "and their prefill is paid again; `gen-pipeline prepare --group-prefixes` writes such rows together"
        )
