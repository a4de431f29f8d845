"""`gen-pipeline report DIR`: a run's summary as a table, plus plots in DIR/report/ (or --out).

The table covers the whole directory (every completion line, the ledger) and the last run (summary.json);
the plots are described in plots.py. Plots need matplotlib (`pip install
'gen-pipeline[report]'`); without it the table is printed alone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ..progress.cost import cost_lines
from ..progress.stats import answers_lines
from ..resume.ledger import ledger_reasons
from ..resume.rejects import reject_counts
from .rundata import Completions, distribution
from .statustext import cache_text

INSTALL_HINT = "plots need matplotlib: pip install 'gen-pipeline[report]'"


# the table


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def _dist_text(d: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v}" for k, v in d.items() if k != "n") if d["n"] else "none"


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    return [
        f"outcome     completed {summary.get('completed')} | skipped {summary.get('skipped')} | "
        f"failed {summary.get('failed')} | exit code {summary.get('exit_code')}",
        f"throughput  {summary.get('requests_per_s')} req/s, {summary.get('output_tokens_per_s')} out tok/s "
        f"over {summary.get('elapsed_s')} s (last run)",
        f"drift       {drift_text(summary.get('token_drift') or {})}; learned offset {summary.get('learned_offset')}",
        *(f"answers     {line}" for line in answers_lines(summary)),
        *(f"cost        {line}" for line in cost_lines(summary)),
    ]


def drift_text(drift: dict[str, Any]) -> str:
    """How often and by how much the server's prompt count differed from ours (server minus ours)."""
    compared = int(drift.get("compared") or 0)
    if not compared:
        return "no row compared (the servers reported no prompt_tokens)"
    offsets = {int(k): int(v) for k, v in (drift.get("by_offset") or {}).items()}
    differed = sum(offsets.values())
    counts = sorted({**offsets, 0: compared - differed}.items())
    seen = [offset for offset, n in counts if n > 0]
    middle, running, median = (compared + 1) // 2, 0, 0
    for offset, n in counts:
        running += n
        if running >= middle:
            median = offset
            break
    return (
        f"{differed} of {compared} rows ({_pct(differed, compared)}) differed; "
        f"server count - ours: min {seen[0]}, median {median}, max {seen[-1]}"
    )


def _server_lines(rows: Completions, summary: dict[str, Any] | None) -> list[str]:
    figures = (summary or {}).get("servers") or {}
    urls = sorted(set(rows.servers) | set(figures))
    width = max((len(u) for u in urls), default=6)
    lines = [f"{'server':<{width}}  {'done':>8}  {'share':>6}  failures (last run)"]
    for url in urls:
        view = figures.get(url) or {}
        fails = view.get("failures") or {}
        share = _pct(rows.servers[url], len(rows))
        lines.append(f"{url:<{width}}  {rows.servers[url]:>8}  {share:>6}  {fails}{cache_text(view)}")
    return lines


def render_table(run: Path, rows: Completions, summary: dict[str, Any] | None, manifest: dict[str, Any] | None) -> str:
    """The run as a readable table."""
    m = manifest or {}
    lines = [f"run {run}: model {m.get('model')}, context {m.get('context_length')}, tokenizer {m.get('tokenizer')}"]
    lines += _summary_lines(summary) if summary else ["no summary.json: the run has not finished (or crashed)"]
    lines.append(f"ledger      {dict(ledger_reasons([run]))} (newest entry per id)")
    if (rejects := reject_counts([run])).answers:
        lines.append(
            f"rejected    {rejects.answers} answers in rejected.jsonl {dict(rejects.by_reason)}, by check "
            f"{rejects.by_check_text()}; {rejects.tokens:,} decode tokens"
        )
    lines.append(f"completions {len(rows)} lines")
    lines.append(f"input tok   sum {sum(rows.input_tokens):,}  {_dist_text(distribution(rows.input_tokens))}")
    lines.append(f"output tok  sum {sum(rows.completion_tokens):,}  {_dist_text(distribution(rows.completion_tokens))}")
    finish = "  ".join(f"{k} {v} ({_pct(v, len(rows))})" for k, v in rows.finish.most_common())
    lines.append(f"finish      {finish or 'none'}")
    if rows.truncated_in:
        cut = "  ".join(f"{k} {v}" for k, v in rows.truncated_in.most_common())
        lines.append(f"truncated   {cut} (finish_reason length: still reasoning, or in the answer)")
    if (summary or {}).get("reasoning_tokens"):
        split = summary["reasoning_tokens"]  # type: ignore[index]
        lines.append(
            f"reasoning   {split['reasoning']:,} tokens, answer {split['answer']:,} (where the servers split them)"
        )
    lines += _server_lines(rows, summary)
    lines += [f"WARNING: {w}" for w in (summary or {}).get("warnings", [])]
    return "\n".join(lines)


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None
