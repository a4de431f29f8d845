"""What an export wrote and what it left out, said once: the card's Counts table (card.py) and the lines
`export` prints are both made from ExportStats here, so they cannot disagree with each other or the rows.

Every readable completion line is in a row, left out by a --drop-* flag ("truncated"), a repeat
("duplicate"), a line of an (id, sample) answered again since ("superseded", samples.py's restarts), or, of
a --turns all run, a turn of a conversation left out whole; every conversation found (each checkpoint's
version of it, in one run, each restart generation's) is a row or left out with one of LEFT_OUT's reasons.
"""

from __future__ import annotations

from typing import Any

from .exportconfig import LEFT_OUT, ExportConfig, ExportStats


def count_rows(config: ExportConfig, stats: ExportStats) -> list[tuple[str, Any]]:
    """The card's counts, (what, how many), rows first."""
    rows: list[tuple[str, Any]] = [("rows", stats.written)]
    if config.turns:
        rows += [(f"conversations: {k.replace('_', ' ')}", stats.conversations[k]) for k in ("complete", "ended_early")]
        rows.append(("turns in the rows", stats.lines))
    elif stats.lines != stats.written:
        rows.append(("completion lines in the rows", stats.lines))
    reasons = ", ".join(f"{k} {v}" for k, v in stats.finish_reasons.most_common()) or "-"
    rows += [
        ("finish reasons", reasons),
        ("prompt tokens", stats.prompt_tokens),
        ("completion tokens", stats.completion_tokens),
        ("of them cut while reasoning (truncated_in reasoning)", stats.truncated_in_reasoning),
        ("left out: truncated (finish_reason length)", stats.truncated),
        ("left out: duplicate (id, sample)", stats.duplicates),
        ("left out: unreadable lines", stats.unreadable),
    ]
    if stats.superseded:
        rows.append(("left out: answered again since (restart)", stats.superseded))
    if config.turns:
        rows += [(f"left out: conversations {LEFT_OUT[k]}", stats.conversations_left_out[k]) for k in _reasons(stats)]
        rows.append(("left out: turns of the conversations left out", stats.turns_left_out))
    if config.rejected:
        rows += [("rejected answers (rejected/, --rejected)", stats.rejected)]
        rows += [("of them with a chosen answer", stats.rejected_with_chosen)]
    return rows


def _reasons(stats: ExportStats) -> list[str]:
    """The reasons a conversation was left out that are worth a line: the flags' always, the others when seen."""
    return [k for k in LEFT_OUT if k in ("hole", "ended_early") or stats.conversations_left_out[k]]


def summary_lines(config: ExportConfig, stats: ExportStats) -> list[str]:
    """What `export` prints when it is done."""
    lines = []
    batch = config.format == "openai-batch"
    if not stats.written and not batch:
        lines.append(f"export: nothing left to export: an empty dataset (0 rows) -> {config.out}")
    if config.turns:
        found = stats.written + sum(stats.conversations_left_out.values())
        why = ", ".join(f"{stats.conversations_left_out[k]} {LEFT_OUT[k]}" for k in _reasons(stats))
        lines.append(
            f"export: {stats.written} conversations ({stats.conversations['complete']} complete, "
            f"{stats.conversations['ended_early']} ended early) of {found} (left out: {why})"
        )
    what = "output lines" if batch else "rows"
    turns = f"{stats.turns_left_out} turns of the conversations left out, " if config.turns else ""
    lines.append(
        f"export: {stats.written} {what} from {stats.lines} completion lines -> {config.out} (left out: "
        f"{stats.truncated} truncated, {turns}{stats.duplicates} duplicates, {stats.unreadable} unreadable lines"
        + (f", {stats.superseded} answered again since" if stats.superseded else "")
        + ")"
        + (f"; rows of {len(stats.checkpoints)} checkpoints" if len(stats.checkpoints) > 1 else "")
        + (f"; {stats.ledgered} ledger entries -> errors.jsonl" if batch else "")
    )
    if config.rejected:
        lines.append(
            f"export: {stats.rejected} rejected answers ({stats.rejected_with_chosen} with a chosen answer) -> "
            f"{config.out / 'rejected'}"
        )
    return lines
