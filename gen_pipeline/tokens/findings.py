"""What `check` calls a problem and `generate` acts on too, written once: tokenizer drift.

The fleet's own disagreements (models, context lengths) are `fleet.discovery.FleetInfo.problems`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import DEFAULT_SAFETY_MARGIN, MAX_LEARNED_OFFSET
from .conversation import SHAPES

# generate judges drift on its first rows compared with the servers' usage.prompt_tokens, then no more
DRIFT_EVIDENCE = 16


TEMPLATE_BLAME = "the tokenizer or chat template is probably not the server's"


def drift_cause(shapes: Mapping[str, int], compared: int, differed: int) -> str:
    """What a drift points at: the request fields or message shapes whose rows drifted while the rows
    without them agreed (`shapes`: RunStats.drift_shapes), else the tokenizer or chat template."""
    named, everywhere = [], []
    for shape in SHAPES:
        rows, drifted = shapes.get(shape, 0), shapes.get(f"{shape} drifted", 0)
        if drifted and drifted == differed and rows < compared:
            named.append(f"{shape} ({drifted} of {rows} such rows differed, none of the {compared - rows} without)")
        elif rows == compared and drifted:
            everywhere.append(shape)
    if named:
        return (
            f"rows with {'; '.join(named)}: the servers render that part of the request differently from "
            "our count (the server kind decides how messages are shaped; report it with the row)"
        )
    if everywhere:
        return f"{TEMPLATE_BLAME}, or it renders {', '.join(everywhere)} (on every row) differently"
    return TEMPLATE_BLAME


def drift_problem(
    by_offset: Mapping[str, int],
    compared: int,
    tokenizer: str,
    subject: str = "probes",
    shapes: Mapping[str, int] | None = None,
) -> str | None:
    """The PROBLEM line for rows whose server count differed from ours (`by_offset`: server - ours -> rows),
    naming what the drifting rows have in common (`shapes`, as drift_cause reads them) when that explains it."""
    differed = {k: v for k, v in by_offset.items() if k != "0"}
    if not differed:
        return None
    margin = max(max(int(k) for k in differed), 0) + DEFAULT_SAFETY_MARGIN
    cause = drift_cause(shapes or {}, compared, sum(differed.values()))
    advice = "use the servers' tokenizer and chat template (--tokenizer)" if cause == TEMPLATE_BLAME else cause
    return (
        f"token count drift: the servers' usage.prompt_tokens minus our count ({tokenizer}) was "
        f"{differed} on {sum(differed.values())} of {compared} {subject}; {advice}, "
        f"or at least --safety-margin {margin}"
    )


def learnable(by_offset: Mapping[str, int]) -> bool:
    """Whether every row drifted by one positive offset that budgets can absorb (the server's template
    adds a fixed number of tokens we do not see: OffsetLearner takes it from the first context 400s)."""
    offsets = [int(k) for k in by_offset]
    return len(offsets) == 1 and 0 < offsets[0] <= MAX_LEARNED_OFFSET


def early_drift_problem(
    drift: Mapping[int, int], tokenizer: str, shapes: Mapping[str, int] | None = None
) -> str | None:
    """For generate's first DRIFT_EVIDENCE compared rows: the PROBLEM line when every one of them drifted
    and not by one learnable offset (every budget is then off); None when they are fine or a few drifted."""
    by_offset = {str(k): v for k, v in drift.items()}
    if "0" in by_offset or learnable(by_offset):
        return None
    problem = drift_problem(by_offset, sum(drift.values()), tokenizer, "rows", shapes)
    return (
        None
        if problem is None
        else f"{problem}; stopped early (the manifest records this tokenizer: rerun with --force once it is fixed)"
    )


def drift_warning(view: Mapping[str, Any], drift_shapes: Any) -> str | None:
    """The end-of-run warning when the servers counted other prompt tokens than we did (None: they agreed),
    naming the request shape that explains it where one does."""
    if view["differed"]:
        cause = drift_cause(drift_shapes, view["compared"], view["differed"])
        return (
            f"the server counted different prompt tokens than we did for {view['differed']} of "
            f"{view['compared']} rows {view['by_offset']}: {cause}"
        )
    return None


def server_cut_warning(cut: int) -> str | None:
    """The end-of-run warning when servers cut answers short of the max_tokens we sent (None: none did)."""
    if not cut:
        return None
    return (
        f"{cut} answer(s) stopped with finish_reason length before their max_tokens: the servers "
        "cut them at a context smaller than our budget assumed (check --context-length and the drift warning)"
    )


def length_hint(finish_reasons: Mapping[str, int], server_cut: int, max_tokens: int) -> str | None:
    """The end-of-run hint when most answers stopped at their max_tokens (finish_reason length, not cut by a
    server's context): they are cut short, and a larger --max-tokens lets them finish (None: most did)."""
    answers = sum(finish_reasons.values())
    cut = finish_reasons.get("length", 0) - server_cut
    if not answers or 2 * cut <= answers:
        return None
    return (
        f"{cut} of {answers} answers ({100 * cut // answers}%) stopped at their max_tokens (finish_reason "
        f"length), cut short: raise --max-tokens (now {max_tokens}) to let them finish"
    )


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
