"""Samples that all came back the same. A server that ignores `seed`, `n` or the sampling fields answers K
identical completions and says nothing, so the run counts: per prompt (and turn) whose samples arrived
together, whether all of them are the same text, and warns, naming the servers, when many are.

Greedy decoding (temperature 0, or top_k 1) is meant to repeat itself: such rows are not judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import Completion

# Warn when at least this many prompts were judged and at least this share of them had identical samples.
IDENTICAL_MIN = 5
IDENTICAL_SHARE = 0.5


def greedy(sampling: dict[str, Any]) -> bool:
    """Whether these request fields ask for greedy decoding (identical samples are then expected)."""
    return sampling.get("temperature") == 0 or sampling.get("top_k") == 1


@dataclass
class SameSamples:
    """How many prompts' samples were compared, how many were all identical, and on which servers."""

    compared: int = 0
    identical: int = 0
    servers: Counter[str] = field(default_factory=Counter)

    def note(self, done: Sequence[Completion]) -> bool:
        """Judge the samples of one prompt that arrived together (by turn); True when the warning is new."""
        before = self.warning() is not None
        by_turn: dict[int | None, list[Completion]] = {}
        for c in done:
            by_turn.setdefault(c.turn, []).append(c)
        for same_turn in by_turn.values():
            if len(same_turn) < 2:
                continue
            self.compared += 1
            first = same_turn[0]
            if all(
                c.completion == first.completion and c.reasoning_content == first.reasoning_content for c in same_turn
            ):
                self.identical += 1
                self.servers.update({c.server for c in same_turn})
        return not before and self.warning() is not None

    def warning(self) -> str | None:
        """The summary's warning when many prompts got identical samples; None otherwise."""
        if self.compared < IDENTICAL_MIN or self.identical < IDENTICAL_SHARE * self.compared:
            return None
        servers = ", ".join(f"{url} ({n})" for url, n in self.servers.most_common())
        return (
            f"{self.identical} of {self.compared} prompts got identical samples (servers: {servers}): the servers "
            "may ignore seed, n or the sampling fields; set --temperature (or --sampling) to sample, or check them"
        )

    def view(self) -> dict[str, int]:
        """summary.json's identical_samples."""
        return {"compared": self.compared, "identical": self.identical}
