"""`gen-pipeline report DIR`: a run's summary as a table, plus plots in DIR/report/ (or --out).

    lengths.png         histograms of input tokens (our count) and completion tokens
    throughput.png      output tokens/s over the last run (estimated, see below) and mean latency
    servers.png         completions and failures per server
    finish_reasons.png  completions by finish_reason

Plots need matplotlib (`pip install 'gen-pipeline[report]'`); without it the table is printed alone.

Completion lines carry no timestamp, but they are in arrival order and a run keeps its servers' slots
full, so the mean number of requests in flight is (sum of latencies) / elapsed (Little's law, elapsed from
summary.json), and a bucket of consecutive lines took (its latency sum) / (that mean) seconds. That is the
time axis of throughput.png, over the lines of the last run (the last `completed` lines); without
summary.json the axis is the completion number and the rate is the mean per-request decode speed.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .errors import ConfigError
from .store import FAILURES, MANIFEST, SUMMARY, iter_json_lines, shard_files

PLOTS = ("lengths.png", "throughput.png", "servers.png", "finish_reasons.png")
BUCKETS = 50
HIST_BINS = 50
INSTALL_HINT = "plots need matplotlib: pip install 'gen-pipeline[report]'"


def distribution(values: Sequence[int] | Sequence[float]) -> dict[str, Any]:
    """Count, min, p50, p90, p99 and max (nearest rank); just the count when empty."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> Any:
        return ordered[max(0, math.ceil(q * n) - 1)]

    return {"n": n, "min": ordered[0], "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[-1]}


@dataclass
class Completions:
    """The columns of completions*.jsonl that the report needs, in line order."""

    input_tokens: array[int] = field(default_factory=lambda: array("q"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    latency: array[float] = field(default_factory=lambda: array("d"))
    servers: Counter[str] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    truncated_in: Counter[str] = field(default_factory=Counter)  # "reasoning" / "answer", of finish "length"

    def __len__(self) -> int:
        return len(self.latency)

    def add(self, obj: dict[str, Any]) -> None:
        self.input_tokens.append(int(obj.get("input_tokens") or 0))
        self.completion_tokens.append(int(obj.get("completion_tokens") or 0))
        self.latency.append(float(obj.get("latency_s") or 0.0))
        self.servers[str(obj.get("server"))] += 1
        self.finish[str(obj.get("finish_reason"))] += 1
        if obj.get("truncated_in"):
            self.truncated_in[str(obj["truncated_in"])] += 1


def completion_files(run: Path) -> list[Path]:
    """completions.jsonl and any per-worker shards."""
    return sorted(run.glob("completions*.jsonl"))


def read_completions(run: Path) -> Completions:
    """Every complete completion line (a torn or corrupt line is skipped)."""
    rows = Completions()
    for path in completion_files(run):
        for _, obj in iter_json_lines(path):
            if obj is not None and "id" in obj:
                rows.add(obj)
    return rows


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing or unreadable."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def ledger_reasons(run: Path) -> Counter[str]:
    """Ledger reasons, the newest entry per (id, sample) deciding (bad rows without an id count once each)."""
    newest: dict[tuple[str, Any], tuple[float, str]] = {}
    anonymous: Counter[str] = Counter()
    for _, obj in (x for path in shard_files(run, FAILURES) for x in iter_json_lines(path)):
        if obj is None or "reason" not in obj:
            continue
        if obj.get("id") is None:
            anonymous[obj["reason"]] += 1
        elif (when := float(obj.get("time") or 0.0)) >= newest.get(
            key := (str(obj["id"]), obj.get("sample", 0)), (float("-inf"), "")
        )[0]:
            newest[key] = (when, obj["reason"])
    return anonymous + Counter(reason for _, reason in newest.values())


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
        f"drift       {summary.get('token_drift')}, learned offset {summary.get('learned_offset')}",
    ]


def _server_lines(rows: Completions, summary: dict[str, Any] | None) -> list[str]:
    figures = (summary or {}).get("servers") or {}
    urls = sorted(set(rows.servers) | set(figures))
    width = max((len(u) for u in urls), default=6)
    lines = [f"{'server':<{width}}  {'done':>8}  {'share':>6}  failures (last run)"]
    for url in urls:
        fails = (figures.get(url) or {}).get("failures") or {}
        lines.append(f"{url:<{width}}  {rows.servers[url]:>8}  {_pct(rows.servers[url], len(rows)):>6}  {fails}")
    return lines


def render_table(run: Path, rows: Completions, summary: dict[str, Any] | None, manifest: dict[str, Any] | None) -> str:
    """The run as a readable table."""
    m = manifest or {}
    lines = [f"run {run}: model {m.get('model')}, context {m.get('context_length')}, tokenizer {m.get('tokenizer')}"]
    lines += _summary_lines(summary) if summary else ["no summary.json: the run has not finished (or crashed)"]
    lines.append(f"ledger      {dict(ledger_reasons(run))} (newest entry per id)")
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


# plots


def throughput_series(
    latency: Sequence[float], tokens: Sequence[int], elapsed: float | None, buckets: int = BUCKETS
) -> tuple[list[float], list[float], list[float], str, str]:
    """Bucketed (x, output tok/s, mean latency, x label, y label), with Little's law when elapsed is known."""
    n = len(latency)
    size = max(1, math.ceil(n / buckets))
    spans = [(i, min(i + size, n)) for i in range(0, n, size)]
    lat = [sum(latency[a:b]) for a, b in spans]
    tok = [sum(tokens[a:b]) for a, b in spans]
    mean_lat = [s / (b - a) for s, (a, b) in zip(lat, spans, strict=True)]
    if elapsed and sum(lat) > 0:
        in_flight = sum(lat) / elapsed
        seconds = [s / in_flight for s in lat]
        ends = [sum(seconds[: i + 1]) for i in range(len(seconds))]
        rate = [t / s if s else 0.0 for t, s in zip(tok, seconds, strict=True)]
        return ends, rate, mean_lat, "seconds into the last run (estimated)", "output tokens/s (all servers)"
    rate = [t / s if s else 0.0 for t, s in zip(tok, lat, strict=True)]
    return [float(b) for _, b in spans], rate, mean_lat, "completion number", "output tokens/s per request"


def _figure(width: float = 10, height: float = 4) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def plot_lengths(rows: Completions, path: Path) -> None:
    fig = _figure()
    for ax, values, title in zip(
        fig.subplots(1, 2),
        (rows.input_tokens, rows.completion_tokens),
        ("input tokens (our count)", "completion tokens"),
        strict=True,
    ):
        ax.hist(list(values), bins=HIST_BINS, color="tab:blue")
        ax.set_title(title)
        ax.set_xlabel("tokens")
        ax.set_ylabel("completions")
    fig.savefig(path, dpi=100)


def plot_throughput(rows: Completions, summary: dict[str, Any] | None, path: Path) -> None:
    last = int((summary or {}).get("completed") or 0)
    elapsed = (summary or {}).get("elapsed_s") if 0 < last <= len(rows) else None
    start = len(rows) - last if elapsed else 0
    x, rate, lat, xlabel, ylabel = throughput_series(rows.latency[start:], rows.completion_tokens[start:], elapsed)
    fig = _figure(10, 6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, rate, color="tab:green")
    top.set_ylabel(ylabel)
    top.set_title(f"throughput over {len(rows) - start} completions, in arrival order")
    bottom.plot(x, lat, color="tab:orange")
    bottom.set_ylabel("mean latency (s)")
    bottom.set_xlabel(xlabel)
    fig.savefig(path, dpi=100)


def _bars(path: Path, title: str, counts: dict[str, int], extra: dict[str, int] | None = None) -> None:
    fig = _figure(10, 4 + 0.15 * len(counts))
    ax = fig.subplots()
    labels = list(counts)
    ax.barh(labels, [counts[k] for k in labels], color="tab:blue", label="completions")
    if extra:
        ax.barh(labels, [extra.get(k, 0) for k in labels], left=[counts[k] for k in labels], color="tab:red")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.savefig(path, dpi=100)


def write_plots(rows: Completions, summary: dict[str, Any] | None, out: Path) -> list[Path]:
    """Every plot as a PNG in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in PLOTS]
    plot_lengths(rows, paths[0])
    plot_throughput(rows, summary, paths[1])
    figures = (summary or {}).get("servers") or {}
    failures = {u: sum((v.get("failures") or {}).values()) for u, v in figures.items()}
    servers = {u: rows.servers.get(u, 0) for u in sorted(set(rows.servers) | set(figures))}
    _bars(paths[2], "completions (blue) and failed requests in the last run (red) per server", servers, failures)
    _bars(paths[3], "completions by finish_reason", dict(rows.finish.most_common()))
    return paths


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `report` flags."""
    parser.add_argument("dir", type=Path, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--out", "-o", type=Path, help="where the plots go (default RUN_DIR/report)")


def main(args: argparse.Namespace) -> int:
    """Print the table and write the plots."""
    run: Path = args.dir
    summary = read_json(run / SUMMARY)
    if not completion_files(run) and summary is None:
        raise ConfigError(f"{run} is not a run directory (no completions*.jsonl, no summary.json)")
    rows = read_completions(run)
    print(render_table(run, rows, summary, read_json(run / MANIFEST)))
    if not len(rows):
        print("no completions yet: no plots")
    elif not has_matplotlib():
        print(INSTALL_HINT)
    else:
        for path in write_plots(rows, summary, args.out or run / "report"):
            print(f"wrote {path}")
    return 0
