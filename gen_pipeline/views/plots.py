"""The plots of `gen-pipeline report` (matplotlib is imported here only, when a plot is drawn).

    lengths.png     input tokens (our count), the rows beyond p99 in one overflow bar when they lie far out;
                    completion tokens stacked by finish_reason, with --max-tokens and the budgets sent below it
    throughput.png  output tokens/s and mean latency over every completion of the directory (all runs)
    servers.png     completions (all runs) and failed requests (last run) per server; down servers labelled

Each completion line carries `time`, when its answer came back: throughput.png puts every line of the
directory (all runs, all shard files) on that clock, in seconds of generation since the first request; a
stretch of more than PAUSE_S with no completion (a run ended, a later one resumed; or an outage) is cut out
and marked. Lines written before lines carried a time are placed by an estimate instead: the mean number
of requests in flight is (sum of latencies) / elapsed (Little's law, from the last run: summary.json's
`completed` lines and `elapsed_s`), and a bucket of consecutive lines took (its latency sum) / (that mean)
seconds, earlier runs' too; without summary.json the axis is the completion number and the rate is the mean
per-request decode speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .rundata import Completions, distribution

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PLOTS = ("lengths.png", "throughput.png", "servers.png")
BUCKETS = 50
HIST_BINS = 50
# The longest inputs get an overflow bar when they lie this far beyond p99: linear bins up to the longest
# would put nearly every row in the first bar.
OVERFLOW_FACTOR = 1.5
FINISH_COLORS = {"stop": "tab:blue", "length": "tab:orange"}
# No completion for this long (and longer than the next answer took): a pause, cut out of the time axis.
PAUSE_S = 300.0


def _figure(width: float = 10, height: float = 4) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def input_bins(values: Sequence[int], bins: int = HIST_BINS) -> tuple[list[float], float | None]:
    """Bin edges for the input histogram, and where the overflow starts (p99) when the longest lie far beyond."""
    d = distribution(values)
    if not d["n"]:
        return [0.0, 1.0], None
    lo, top = float(d["min"]), float(d["max"])
    cut = float(d["p99"]) if top > OVERFLOW_FACTOR * max(d["p99"], 1) else None
    hi = cut if cut is not None else top
    width = max((hi - lo) / bins, 1e-9) if hi > lo else 1.0
    return [lo + i * width for i in range(bins + 1)], cut


def plot_inputs(ax: Axes, values: Sequence[int], context: int | None) -> None:
    """Input lengths, the tail past p99 in one red bar when it lies far out."""
    edges, cut = input_bins(values)
    shown = [v for v in values if cut is None or v <= cut]
    ax.hist(shown, bins=edges, color="tab:blue", label=f"{len(shown)} rows")
    if cut is not None:
        beyond = len(values) - len(shown)
        width = edges[1] - edges[0]
        label = f"{beyond} rows beyond p99 ({cut:.0f}), up to {max(values)}"
        ax.bar(edges[-1] + 2 * width, beyond, width=2 * width, color="tab:red", label=label)
        ax.annotate(f"> {cut:.0f}\n({beyond})", (edges[-1] + 2 * width, beyond), ha="center", va="bottom")
    title = "input tokens (our count)" + (f", context {context}" if context else "")
    ax.set_title(title + ("; x axis clipped at p99" if cut is not None else ""))
    ax.set_xlabel("tokens")
    ax.set_ylabel("completions")
    ax.margins(y=0.25)
    ax.legend(loc="upper left", fontsize="small")


def plot_outputs(ax: Axes, rows: Completions, max_tokens: int | None) -> None:
    """Completion lengths by finish_reason; --max-tokens and the budgets sent below it marked."""
    values = list(rows.completion_tokens)
    top = max([*values, max_tokens or 0, 1])
    edges = [top * i / HIST_BINS for i in range(HIST_BINS + 1)]
    reasons = [r for r, _ in rows.finish.most_common()]
    by_reason = [[v for v, f in zip(values, rows.finish_of, strict=True) if f == r] for r in reasons]
    colors = [FINISH_COLORS.get(r, f"C{i + 2}") for i, r in enumerate(reasons)]
    labels = [f"finish {r}: {len(vs)}" for r, vs in zip(reasons, by_reason, strict=True)]
    ax.hist(by_reason, bins=edges, stacked=True, color=colors, label=labels)
    if max_tokens:
        ax.axvline(max_tokens, color="black", linestyle="--", label=f"--max-tokens {max_tokens}")
        below = [b for b in rows.budget if 0 < b < max_tokens]
        if below:  # a step outline for their spread, and a tick each, so that a handful still shows
            label = f"budget sent below it: {len(below)} rows, from {min(below)} (clamped to fit, or the row's own)"
            ax.hist(below, bins=edges, histtype="step", color="tab:red", linewidth=1.5, label=label)
            ax.plot(below, [0] * len(below), "|", color="tab:red", markersize=16, markeredgewidth=2, clip_on=False)
    ax.set_title("completion tokens")
    ax.set_xlabel("tokens")
    ax.set_ylabel("completions")
    ax.margins(y=0.45)  # headroom: the legend sits above the bars
    ax.legend(loc="upper left", fontsize="small")


def plot_lengths(rows: Completions, manifest: dict[str, Any] | None, path: Path) -> None:
    fig = _figure(12, 4.5)
    left, right = fig.subplots(1, 2)
    m = manifest or {}
    plot_inputs(left, rows.input_tokens, m.get("context_length"))
    plot_outputs(right, rows, m.get("max_tokens"))
    fig.savefig(path, dpi=100)


def mean_in_flight(rows: Completions, summary: dict[str, Any] | None) -> tuple[float | None, int]:
    """Requests in flight on average in the last run (Little's law), and the line that run began at."""
    last = int((summary or {}).get("completed") or 0)
    elapsed = float((summary or {}).get("elapsed_s") or 0.0)
    if not 0 < last <= len(rows) or elapsed <= 0:
        return None, 0
    busy = sum(rows.latency[len(rows) - last :])
    return (busy / elapsed if busy > 0 else None), len(rows) - last


def throughput_series(
    latency: Sequence[float], tokens: Sequence[int], in_flight: float | None, buckets: int = BUCKETS
) -> tuple[list[float], list[float], list[float], str, str]:
    """Bucketed (x, output tok/s, mean latency, x label, y label); seconds when `in_flight` is known."""
    n = len(latency)
    size = max(1, math.ceil(n / buckets))
    spans = [(i, min(i + size, n)) for i in range(0, n, size)]
    lat = [sum(latency[a:b]) for a, b in spans]
    tok = [sum(tokens[a:b]) for a, b in spans]
    mean_lat = [s / (b - a) for s, (a, b) in zip(lat, spans, strict=True)]
    if in_flight:
        seconds = [s / in_flight for s in lat]
        ends = [sum(seconds[: i + 1]) for i in range(len(seconds))]
        rate = [t / s if s else 0.0 for t, s in zip(tok, seconds, strict=True)]
        return ends, rate, mean_lat, "seconds of generation (estimated)", "output tokens/s (all servers)"
    rate = [t / s if s else 0.0 for t, s in zip(tok, lat, strict=True)]
    return [float(b) for _, b in spans], rate, mean_lat, "completion number", "output tokens/s per request"


def timeline(times: Sequence[float], latency: Sequence[float]) -> tuple[list[int], list[float], list[float]] | None:
    """The lines in the order their answers came back, each one's place on the time axis (seconds of
    generation since the first request was sent, pauses cut out), and where each pause was cut; None when
    a line has no time (written before lines carried one)."""
    if not times or any(math.isnan(t) for t in times):
        return None
    order = sorted(range(len(times)), key=times.__getitem__)
    first = order[0]
    cut, prev = times[first] - latency[first], times[first]
    x: list[float] = []
    pauses: list[float] = []
    for i in order:
        gap = times[i] - prev
        if gap > PAUSE_S and gap > latency[i]:  # nothing came back, and this request was sent after it
            pauses.append(x[-1])
            cut += gap - latency[i]
        x.append(times[i] - cut)
        prev = times[i]
    return order, x, pauses


def timed_series(
    rows: Completions, buckets: int = BUCKETS
) -> tuple[list[float], list[float], list[float], list[float]] | None:
    """Bucketed (x, output tok/s, mean latency, pauses) on the lines' own clock; None when a line has no time."""
    line = timeline(rows.time, rows.latency)
    if line is None:
        return None
    order, x, pauses = line
    width = max(x[-1], 1e-9) / buckets
    tokens, latency, count = [0] * buckets, [0.0] * buckets, [0] * buckets
    for i, at in zip(order, x, strict=True):
        b = min(int(at / width), buckets - 1)
        tokens[b] += rows.completion_tokens[i]
        latency[b] += rows.latency[i]
        count[b] += 1
    ends = [width * (b + 1) for b in range(buckets)]
    mean = [s / n if n else math.nan for s, n in zip(latency, count, strict=True)]
    return ends, [t / width for t in tokens], mean, pauses


def plot_throughput(rows: Completions, summary: dict[str, Any] | None, path: Path) -> None:
    timed = timed_series(rows)
    if timed is not None:
        x, rate, lat, marks = timed
        xlabel, ylabel = "seconds of generation (pauses with no completion cut out)", "output tokens/s (all servers)"
        note = " pause cut out here"
    else:
        in_flight, resumed_at = mean_in_flight(rows, summary)
        x, rate, lat, xlabel, ylabel = throughput_series(rows.latency, rows.completion_tokens, in_flight)
        where = sum(rows.latency[:resumed_at]) / in_flight if in_flight else float(resumed_at)
        marks, note = ([where] if resumed_at else []), " last run began here"
    fig = _figure(10, 6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, rate, color="tab:green")
    top.set_ylabel(ylabel)
    top.set_title(f"throughput over all {len(rows)} completions of the directory")
    bottom.plot(x, lat, color="tab:orange")
    bottom.set_ylabel("mean latency (s)")
    bottom.set_xlabel(xlabel)
    for where in marks:  # where a run resumed an earlier one (or the fleet stopped answering for a while)
        for ax in (top, bottom):
            ax.axvline(where, color="grey", linestyle="--")
        top.annotate(note, (where, max(rate, default=0)), va="top", color="grey")
    fig.savefig(path, dpi=100)


def server_notes(summary: dict[str, Any] | None) -> dict[str, str]:
    """Per server, why it did less than the others in the last run: no request at all, or time out of service."""
    figures = (summary or {}).get("servers") or {}
    anyone = any((v or {}).get("requests") for v in figures.values())
    notes = {}
    for url, v in figures.items():
        if anyone and not (v or {}).get("requests"):
            notes[url] = "DOWN: no request in the last run"
        elif (v or {}).get("out_of_service_s"):
            notes[url] = f"out of service {v['out_of_service_s']} s in the last run"
    return notes


def plot_servers(rows: Completions, summary: dict[str, Any] | None, path: Path) -> None:
    servers = set(rows.servers) | set((summary or {}).get("servers") or {})
    fig = _figure(10, 2 + 0.45 * len(servers))
    draw_servers(fig.subplots(), rows, summary)
    fig.savefig(path, dpi=100)


def draw_servers(ax: Axes, rows: Completions, summary: dict[str, Any] | None) -> None:
    """One bar per server, its figures written beside it, the axis wide enough for both."""
    figures = (summary or {}).get("servers") or {}
    urls = sorted(set(rows.servers) | set(figures))
    done = [rows.servers.get(u, 0) for u in urls]
    failed = [sum(((figures.get(u) or {}).get("failures") or {}).values()) for u in urls]
    notes = server_notes(summary)
    rows_y = list(range(len(urls)))
    ax.barh(rows_y, done, color="tab:blue", label="completions (all runs)")
    ax.barh(rows_y, failed, left=done, color="tab:red", label="failed requests (last run)")
    ax.set_yticks(rows_y, labels=urls)
    right = max([d + f for d, f in zip(done, failed, strict=True)] or [1]) or 1
    for y, url, d, f in zip(rows_y, urls, done, failed, strict=True):
        text = f" {d} done" + (f", {f} failed" if f else "") + (f"  {notes[url]}" if url in notes else "")
        ax.text(d + f, y, text, va="center", color="tab:red" if url in notes else "black")
    ax.set_xlim(0, right * 1.6)  # room for the labels: no bar or label runs off the axes
    ax.set_xlabel("rows")
    ax.set_title("completions and failed requests per server")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize="small")


def write_plots(
    rows: Completions, summary: dict[str, Any] | None, manifest: dict[str, Any] | None, out: Path
) -> list[Path]:
    """Every plot as a PNG in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in PLOTS]
    plot_lengths(rows, manifest, paths[0])
    plot_throughput(rows, summary, paths[1])
    plot_servers(rows, summary, paths[2])
    return paths
