"""What a run cost in GPU time, and per useful token: the cost figures of summary.json, `report` and the card.

GPU-hours are the fleet's time: each process adds its elapsed time x its servers x --gpus-per-server,
divided by the processes of one node that share those servers (--workers K), so parts add up to the run.
Useful ("valid") output is what can go into a dataset: the completion tokens of written rows (a ledgered
row has none), and of those the rows not cut at max_tokens (finish_reason length), which
`export --drop-truncated` leaves out.
"""

from __future__ import annotations

from typing import Any

from ..records import Completion

MILLION = 1_000_000


def useful_tokens(outcomes: list[Any], output_tokens: int) -> tuple[int, int]:
    """(valid, untruncated) completion tokens of one prompt's written completions. A choice of a request
    with n has no count of its own: the request's tokens not claimed by a counted answer are shared out."""
    done = [o for o in outcomes if isinstance(o, Completion)]
    uncounted = [o for o in done if o.completion_tokens is None]
    rest = max(output_tokens - sum(o.completion_tokens or 0 for o in done), 0)
    share = rest / len(uncounted) if uncounted else 0.0

    def tokens(o: Completion) -> float:
        return share if o.completion_tokens is None else o.completion_tokens

    valid = sum(tokens(o) for o in done)
    untruncated = sum(tokens(o) for o in done if o.finish_reason != "length")
    return round(valid), round(untruncated)


def gpu_hours(elapsed_s: float, servers: int, gpus_per_server: int, sharing: int) -> float:
    """This process's part of the fleet's GPU time."""
    return elapsed_s * servers * gpus_per_server / max(sharing, 1) / 3600


def run_cost(summary: dict[str, Any], elapsed_s: float, servers: int, config: Any) -> dict[str, Any]:
    """One process's cost fields for its summary (the --workers K claimers of a node share its servers)."""
    hours = round(gpu_hours(elapsed_s, servers, config.gpus_per_server, config.share), 4)
    fields = {"gpus_per_server": config.gpus_per_server, "gpu_hours": hours}
    return {**fields, **derive({**summary, **fields})}


def per_million(hours: float | None, tokens: int | None) -> float | None:
    """GPU-hours per million tokens (None without tokens)."""
    return round(hours * MILLION / tokens, 4) if hours is not None and tokens else None


def derive(summary: dict[str, Any]) -> dict[str, Any]:
    """The rates and GPU-hours per million tokens from a summary's sums and elapsed_s."""
    elapsed = max(float(summary.get("elapsed_s") or 0.0), 1e-9)
    hours = summary.get("gpu_hours")
    valid, untruncated = summary.get("valid_output_tokens", 0), summary.get("untruncated_output_tokens", 0)
    return {
        "valid_output_tokens_per_s": round(valid / elapsed, 1),
        "untruncated_output_tokens_per_s": round(untruncated / elapsed, 1),
        "gpu_hours_per_million_output_tokens": per_million(hours, summary.get("output_tokens")),
        "gpu_hours_per_million_valid_tokens": per_million(hours, valid),
        "gpu_hours_per_million_untruncated_tokens": per_million(hours, untruncated),
    }


def cost_lines(summary: dict[str, Any]) -> list[str]:
    """The cost as `report` and the end-of-run summary print it (nothing for a summary without one)."""
    if summary.get("gpu_hours") is None:
        return []
    return [
        f"GPU-hours {summary['gpu_hours']} ({summary.get('gpus_per_server', 1)} per server) | per million output "
        f"tokens {summary.get('gpu_hours_per_million_output_tokens')}, valid "
        f"{summary.get('gpu_hours_per_million_valid_tokens')}, untruncated "
        f"{summary.get('gpu_hours_per_million_untruncated_tokens')}",
        f"valid tokens/s {summary.get('valid_output_tokens_per_s')} (written rows), untruncated "
        f"{summary.get('untruncated_output_tokens_per_s')} (without finish_reason length)",
    ]
