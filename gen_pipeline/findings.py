"""What `check` calls a problem and `generate` acts on too, written once: tokenizer drift.

The fleet's own disagreements (models, context lengths) are `fleet.FleetInfo.problems`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import DEFAULT_SAFETY_MARGIN, MAX_LEARNED_OFFSET

# generate judges drift on its first rows compared with the servers' usage.prompt_tokens, then no more
DRIFT_EVIDENCE = 16


def drift_problem(by_offset: Mapping[str, int], compared: int, tokenizer: str, subject: str = "probes") -> str | None:
    """The PROBLEM line for rows whose server count differed from ours (`by_offset`: server - ours -> rows)."""
    differed = {k: v for k, v in by_offset.items() if k != "0"}
    if not differed:
        return None
    margin = max(max(int(k) for k in differed), 0) + DEFAULT_SAFETY_MARGIN
    return (
        f"tokenizer drift: the servers' usage.prompt_tokens minus our count ({tokenizer}) was "
        f"{differed} on {sum(differed.values())} of {compared} {subject}; use the servers' tokenizer "
        f"and chat template (--tokenizer), or at least --safety-margin {margin}"
    )


def learnable(by_offset: Mapping[str, int]) -> bool:
    """Whether every row drifted by one positive offset that budgets can absorb (the server's template
    adds a fixed number of tokens we do not see: OffsetLearner takes it from the first context 400s)."""
    offsets = [int(k) for k in by_offset]
    return len(offsets) == 1 and 0 < offsets[0] <= MAX_LEARNED_OFFSET


def early_drift_problem(drift: Mapping[int, int], tokenizer: str) -> str | None:
    """For generate's first DRIFT_EVIDENCE compared rows: the PROBLEM line when every one of them drifted
    and not by one learnable offset (every budget is then off); None when they are fine or a few drifted."""
    by_offset = {str(k): v for k, v in drift.items()}
    if "0" in by_offset or learnable(by_offset):
        return None
    problem = drift_problem(by_offset, sum(drift.values()), tokenizer, "rows")
    return (
        None
        if problem is None
        else f"{problem}; stopped early (the manifest records this tokenizer: rerun with --force once it is fixed)"
    )


def drift_warning(view: Mapping[str, Any]) -> str | None:
    """The end-of-run warning when the servers counted other prompt tokens than we did (None: they agreed)."""
    if view["differed"]:
        return (
            f"the server counted different prompt tokens than we did for {view['differed']} of "
            f"{view['compared']} rows {view['by_offset']}: the tokenizer or chat template is "
            "probably not the server's"
        )
    return None


def over_length_advice(failed: Mapping[str, int], view: Mapping[str, Any]) -> str | None:
    """Rows skipped as over_length on a count the servers contradict must not stay skipped unnoticed."""
    skipped = failed.get("over_length", 0)
    if skipped and view["differed"]:
        return (
            f"{skipped} row(s) were skipped as over_length on our token count, which the servers' counts "
            "contradict (see the drift warning): once --tokenizer matches the servers', run again with "
            "--retry-failed over_length to send them"
        )
    return None
