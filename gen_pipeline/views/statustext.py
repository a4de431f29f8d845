"""A status.json snapshot as text lines, shared by `status` and its claimed-shard view (claimstatus.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..progress.display import duration

CHUNK = 1 << 20
# Seconds without a row settled before a running run is shown as stalled (an outage, a hung fleet): its
# rates (run averages) and ETA would go on showing how it was doing before.
STALLED_AFTER = 60.0


def _server_line(url: str, s: dict[str, Any]) -> str:
    health = (
        "RETIRED (another checkpoint)"
        if s.get("retired")
        else "healthy"
        if s.get("healthy", True)
        else "OUT OF SERVICE"
    )
    return (
        f"  {url}  in flight {s.get('in_flight', 0)}/{s.get('capacity', '?')}{_queued(s)}  {health}  "
        f"requests {s.get('requests', 0)}{cache_text(s)}  failures {s.get('failures') or {}}"
        + (f"  rejected {s['rejected']}" if s.get("rejected") else "")
    )


def _by_count(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def answers_line(answers: dict[str, Any] | None) -> list[str]:
    """The answers the checks rejected so far: how many of those judged, by reason and by check (none: no line)."""
    rejected = (answers or {}).get("rejected") or {}
    if not rejected or answers is None:
        return []
    judged, n = answers.get("attempts") or 0, sum(rejected.values())
    rate = f" ({100 * n / judged:.1f}%)" if judged else ""
    by_check = answers.get("rejected_by_check") or {}
    return [
        f"answers: {judged} judged, {n} rejected{rate}: {_by_count(rejected)}"
        + (f" (by check: {_by_count(by_check)})" if by_check else "")
    ]


def _queued(s: dict[str, Any]) -> str:
    return f" (queued {s['queued']})" if s.get("queued") else ""


def cache_text(s: dict[str, Any]) -> str:
    """A server's prefix-cache share and the prefill it paid, where it reports cached tokens (else "")."""
    prompt, cached = s.get("prompt_tokens") or 0, s.get("cached_tokens")
    if cached is None or not prompt:
        return ""
    return f"  cached {100 * cached / prompt:.0f}%  prefill {prompt - cached:,} tok"


def ago(status: dict[str, Any], now: float) -> str:
    """How long ago a status snapshot was written, as a duration."""
    return duration(max(0.0, now - float(status.get("updated", now))))


def render_status(status: dict[str, Any], now: float | None = None) -> str:
    """A status.json snapshot as readable lines."""
    now = time.time() if now is None else now
    head = f"{status.get('state', 'running')} (pid {status.get('pid')}), updated {ago(status, now)} ago"
    return "\n".join([head, *status_lines(status)])


def status_lines(status: dict[str, Any]) -> list[str]:
    """Everything below the first line: counts, rates, servers, last errors."""
    counts, rates = status.get("counts") or {}, status.get("rates") or {}
    failed = counts.get("failed") or {}
    eta = status.get("eta_s")
    servers = status.get("servers") or {}
    healthy = sum(bool(s.get("healthy", True)) for s in servers.values())
    not_sent = f" | not sent {counts['not_sent']} (their conversation ended)" if counts.get("not_sent") else ""
    lines = [
        how_far(counts) + f"done {counts.get('done', 0)} | skipped {counts.get('skipped', 0)} | "
        f"failed {f'{sum(failed.values())} {failed}' if failed else 0}{not_sent} | "
        f"in flight {counts.get('in_flight', 0)}" + (f" | queued {counts['queued']}" if "queued" in counts else ""),
        waiting(status)
        or stalled(status)
        or f"{rates.get('req_per_s', 0)} req/s | {rates.get('out_tok_per_s', 0)} out tok/s | "
        f"ETA {duration(eta) if eta is not None else 'unknown'}",
    ]
    lines += answers_line(status.get("answers"))
    lines.append(f"servers: {healthy} of {len(servers)} healthy")
    lines += [_server_line(url, s) for url, s in servers.items()]
    lines += [f"last {reason}: {text}" for reason, text in (status.get("last_error") or {}).items()]
    lines += [f"ALERT: {alert}" for alert in status.get("alerts") or []]
    return lines


def how_far(counts: dict[str, Any]) -> str:
    """ "1,200 of 5,000 turns settled (24%) | " when the run knows its total (else "")."""
    total = counts.get("total")
    if not total:
        return ""
    failed = sum((counts.get("failed") or {}).values())
    settled = counts.get("done", 0) + counts.get("skipped", 0) + failed + counts.get("not_sent", 0)
    unit = counts.get("unit", "row")
    return f"{settled:,} of {total:,} {unit}s settled ({100 * settled / total:.0f}%) | "


def waiting(status: dict[str, Any]) -> str | None:
    """The rates line during an outage: no server usable, so the last rate and an ETA would say nothing."""
    outage = status.get("outage_s")
    if not outage or status.get("state", "running") != "running":
        return None
    return f"waiting for servers: none usable for {duration(float(outage))} | rate and ETA unknown until one answers"


def stalled(status: dict[str, Any]) -> str | None:
    """The rates line of a run that has settled no row for STALLED_AFTER seconds (None: it has lately)."""
    if status.get("last_settled") is None or status.get("state", "running") != "running":
        return None
    idle = float(status.get("updated", 0)) - float(status["last_settled"])
    if idle < STALLED_AFTER:
        return None
    since = time.strftime("%H:%M:%S", time.localtime(float(status["last_settled"])))
    return f"STALLED: no row settled for {duration(idle)} (since {since}) | rate and ETA unknown"


def count_lines(path: Path) -> int:
    """Newlines in a file, read in chunks (completions files are large)."""
    n = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            n += chunk.count(b"\n")
    return n
