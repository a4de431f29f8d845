"""`gen-pipeline generate`: its flags (shared with `check`) and the call into the library (modes.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..config import (
    API_KEY_ENV,
    DEFAULT_CONCURRENCY,
    DEFAULT_FSYNC_INTERVAL,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_RESAMPLES,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_TOKENS,
    DEFAULT_OUTAGE_TIMEOUT,
    DEFAULT_SAFETY_MARGIN,
    DEFAULT_SERVERS,
    DEFAULT_STARTUP_TIMEOUT,
    LOADER_ENV,
    SERVER_AUTH_ENV,
    RunConfig,
)
from ..options import OPTIONS, build_config
from ..settings import read_settings
from .watch import add_watch_flags

STATIC_SHARDS_GONE = (
    "--shard i/K is gone with the static shards of earlier versions: use --workers K (claimers on this node), "
    "or --shards V with claimers (--join) on several nodes"
)


class _StaticShardGone(argparse.Action):
    """`--shard`: refused in one line (exit 2, a usage error), whatever follows it."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.exit(2, f"error: {STATIC_SHARDS_GONE}\n")


# generate's flag groups, in the order --help shows them. A new flag goes into the group of its kind:
# `groups["answers"].add_argument(...)` in add_run_flags when `check` uses it too, else in add_arguments.
# argparse leaves a group out of --help while it holds no flag (or only hidden ones), so none is a stub.
GROUPS = (
    "input and output",
    "model and budget",
    "sampling",
    "answers",
    "fleet",
    "resume and safety",
    "scale-out",
    "observability",
)
Groups = dict[str, Any]  # title -> argparse's _ArgumentGroup (a private class)


def flag_groups(p: argparse.ArgumentParser) -> Groups:
    """p's flag groups by title, made in GROUPS order on first use."""
    made = {g.title: g for g in p._action_groups if g.title in GROUPS}
    return made or {title: p.add_argument_group(title) for title in GROUPS}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `generate` flags."""
    groups = flag_groups(p)
    groups["input and output"].add_argument("--out", "-o", type=Path, required=True, help="run directory (created)")
    add_run_flags(p)
    scale = groups["scale-out"]
    scale.add_argument(
        "--workers",
        type=int,
        default=1,
        help="claimer processes on this node, each claiming open shards of the run (default 1)",
    )
    scale.add_argument(
        "--shards",
        type=int,
        help="virtual shards of a new run directory, by the stable id hash (default 256; kept in the manifest)",
    )
    scale.add_argument(
        "--join",
        action="store_true",
        help="claim open shards beside the other processes writing this run directory (one per node)",
    )
    scale.add_argument("--share", type=int, default=1, help=argparse.SUPPRESS)  # set by --workers K: K share a server
    # an exact match wins over abbreviations: without it, `--shard 0/2` was read as --shards and failed on '0/2'
    scale.add_argument("--shard", nargs="?", action=_StaticShardGone, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    scale.add_argument("--parent-fd", type=int, help=argparse.SUPPRESS)  # a worker's pipe from its parent
    add_watch_flags(groups["observability"])


def add_run_flags(p: argparse.ArgumentParser, run_only: Any = None) -> None:
    """Every `generate` flag but --out: `check` takes the same ones, so a plan matches the run.

    `run_only` replaces the help of the flags that only shape a run (timeouts, retries, shutdown,
    progress): `check` passes argparse.SUPPRESS, so its --help lists only the flags it uses.
    """
    groups = flag_groups(p)
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a TOML file of these flags (keys as the long flags without --); a flag given here wins over it",
    )
    _add_input_flags(groups["input and output"])
    _add_budget_flags(groups["model and budget"])
    _add_sampling_flags(groups["sampling"])
    _add_answer_flags(groups["answers"], run_only)
    _add_fleet_flags(groups["fleet"], run_only)
    _add_safety_flags(groups["resume and safety"], run_only)
    groups["observability"].add_argument(
        "--progress",
        choices=["auto", "bar", "log", "off"],
        default="auto",
        help=run_only or "auto (default): a bar on a terminal or in a notebook, else a log line every 30 s",
    )


def _add_input_flags(g: Any) -> None:
    """What to read, and how a row becomes a request."""
    g.add_argument(
        "--input",
        "-i",
        type=Path,
        required=True,
        help="the prompts: JSONL or a JSON array (rows with messages or prompt, ShareGPT conversations, Alpaca "
        "instruction/input/output, or text), CSV or Parquet (plain, gzip or zstd), a folder saved by datasets' "
        "save_to_disk, or a hub dataset name[:config][:split]",
    )
    g.add_argument("--limit", type=int, metavar="N", help="only the first N rows of the input (a smoke test)")
    g.add_argument(
        "--system-prompt",
        metavar="TEXT",
        help="a system turn for every row that has none (@FILE reads it from FILE); counted, and kept in the manifest",
    )
    g.add_argument(
        "--template",
        metavar="FILE",
        help="a Jinja2 template over each row's columns ({{ question }}) that renders its user message "
        "(sandboxed; a column the row lacks makes the row bad_input); counted, sent and recorded",
    )
    g.add_argument(
        "--redo-changed",
        action="store_true",
        help="answer again the answered rows whose prompt in the input changed since (without it they are counted "
        "and named); the output stays append-only, export keeps the newer answer",
    )
    g.add_argument(
        "--append-input",
        action="store_true",
        help="this run adds another input's rows to an --out that holds earlier inputs' on purpose (the nightly "
        "job does): no warning that --out holds rows answered from another input",
    )
    g.add_argument(
        "--turns",
        choices=["last", "all"],
        default="last",
        help="last: answer each row's last user turn (default); all: regenerate every turn of the conversation",
    )
    g.add_argument(
        "--tools", metavar="FILE", help="a JSON file with an OpenAI tools list for every row without its own (counted)"
    )
    g.add_argument(
        "--chat-template-kwargs",
        metavar="JSON",
        help="template switches for every row without its own, e.g. '{\"enable_thinking\": false}' (counted)",
    )


def _add_budget_flags(g: Any) -> None:
    """The model, its tokenizer and context, and each request's token budget."""
    g.add_argument("--tokenizer", help="tokenizer folder or hub name (default: what servers report)")
    g.add_argument("--model", help="model name to send (default: the id the servers report)")
    g.add_argument("--context-length", type=int, help="default: smallest max_model_len of the fleet")
    g.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"output budget per prompt, clamped to fit the context (default {DEFAULT_MAX_TOKENS})",
    )
    g.add_argument(
        "--min-tokens",
        type=int,
        help=f"skip a prompt as over_length when less room is left (default {DEFAULT_MIN_TOKENS}, or --max-tokens "
        "when that is smaller)",
    )
    g.add_argument(
        "--safety-margin",
        type=int,
        default=DEFAULT_SAFETY_MARGIN,
        help=f"tokens kept free beyond the exact count (default {DEFAULT_SAFETY_MARGIN})",
    )
    g.add_argument(
        "--thinking-budget",
        type=int,
        help="the servers' thinking-token budget (SGLang thinking_budget, vLLM thinking_token_budget)",
    )


def _add_sampling_flags(g: Any) -> None:
    """How each completion is sampled, and how many per prompt."""
    g.add_argument("--temperature", type=float, help="sampling temperature")
    g.add_argument("--top-p", type=float, help="nucleus sampling")
    g.add_argument("--seed", type=int, help="sampling seed (each sample's seed derives from it, the id and the sample)")
    g.add_argument(
        "--samples",
        type=int,
        help='completions per prompt, each a line with its "sample" (default 1; a row\'s "samples" overrides it)',
    )
    g.add_argument(
        "--samples-via",
        choices=["n", "requests"],
        default="n",
        help="n: one request with n per prompt (default); requests: one per sample, on the same server",
    )
    g.add_argument("--sampling", help="JSON object of other request fields, e.g. '{\"top_k\": 20}'")


def _add_answer_flags(g: Any, run_only: Any) -> None:
    """The answer checks and resampling (docs/how-to/answers.md), and the loop guard (docs/how-to/loop-guard.md)."""
    g.add_argument(
        "--validate",
        action="append",
        metavar="KIND",
        help="check every answer: json, regex:PATTERN (re.search on the answer) or python:MODULE:FUNCTION "
        "(FUNCTION(answer) returns None, or a reason to reject it); may be given more than once. A rejected "
        "answer is kept in rejected.jsonl and resampled",
    )
    g.add_argument(
        "--json-schema",
        metavar="FILE",
        help="a JSON Schema every answer must follow: sent as response_format (the server constrains the "
        "answer to it) and checked on the answer",
    )
    g.add_argument(
        "--max-resamples",
        type=int,
        default=DEFAULT_MAX_RESAMPLES,
        metavar="N",
        help=f"send a rejected answer again, with a new seed, at most N times, then ledger it invalid or "
        f"degenerate (default {DEFAULT_MAX_RESAMPLES}: at a 10%% reject rate 1 row in 1000 is ledgered, and a "
        "prompt no new draw fixes costs at most 3 answers)",
    )
    g.add_argument(
        "--loop-guard",
        choices=["on", "off"],
        default="on",
        help=run_only
        or "on (default): stream each answer and stop one that falls into a repetition loop while it decodes, "
        "on the server too; off: read answers whole",
    )


def _add_fleet_flags(g: Any, run_only: Any) -> None:
    """The servers, how hard each is driven, and how long a request or an outage may last."""
    g.add_argument(
        "--servers",
        "-s",
        default=DEFAULT_SERVERS,
        help=f"host:lo-hi, host:port or URLs, comma separated (default {DEFAULT_SERVERS})",
    )
    g.add_argument("--api-key", help=f"Bearer token (default: ${API_KEY_ENV})")
    g.add_argument(
        "--concurrency",
        type=int,
        help=f"requests in flight per server (default: the server's max_running_requests, else {DEFAULT_CONCURRENCY})",
    )
    g.add_argument(
        "--queue-margin",
        type=int,
        help="requests kept queued on each server beyond the max_running_requests it reports, so its queue "
        "never runs dry (default: an eighth of them, at least 2; 0 with --concurrency)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        help="seconds per request (default: 120 + 0.1 per max_tokens)",
    )
    g.add_argument(
        "--max-attempts",
        type=int,
        default=DEFAULT_MAX_ATTEMPTS,
        help=run_only or f"transport attempts per prompt (default {DEFAULT_MAX_ATTEMPTS})",
    )
    g.add_argument(
        "--startup-timeout",
        type=float,
        default=DEFAULT_STARTUP_TIMEOUT,
        help=run_only or "wait this long for a first server to answer",
    )
    g.add_argument(
        "--outage-timeout",
        type=float,
        default=DEFAULT_OUTAGE_TIMEOUT,
        help=run_only or "stop (exit 4) after this long with no usable server",
    )


def _add_safety_flags(g: Any, run_only: Any) -> None:
    """Resuming a run directory: what to resend, what to accept, and how a stop keeps the output whole."""
    g.add_argument(
        "--retry-failed",
        metavar="REASONS",
        help="resend rows whose ledger reason is one of these (comma list, or all)",
    )
    g.add_argument("--force", action="store_true", help="resume despite changed settings")
    g.add_argument(
        "--accept-checkpoint",
        action="store_true",
        help="resume although the servers serve another checkpoint (model_path, weight_version or server "
        "version) than the one that wrote the run's rows; the manifest keeps both, each line names its own",
    )
    g.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD,
        help=run_only or "seconds in-flight requests get after Ctrl-C",
    )
    g.add_argument(
        "--fsync-interval",
        type=float,
        default=DEFAULT_FSYNC_INTERVAL,
        help=run_only or "seconds between fsyncs of the output (lines are flushed at once)",
    )


def with_config_file(p: argparse.ArgumentParser, argv: list[str]) -> None:
    """--config FILE's settings (when argv names one) as p's defaults: a flag on the command line still wins,
    and one the file gives is no longer required."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", type=Path)
    found, _ = early.parse_known_args(argv)
    if found.config is None:
        return
    settings = read_settings(found.config)
    for action in p._actions:
        if action.dest in settings:
            action.default, action.required = settings[action.dest], False


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Build the frozen RunConfig from parsed flags (and the API key, server credentials and tokenizer loader
    variables)."""
    options = {k: v for k, v in vars(args).items() if k in OPTIONS}
    options["api_key"] = args.api_key or os.environ.get(API_KEY_ENV) or None
    if auth := os.environ.get(SERVER_AUTH_ENV):  # a --workers claimer: its parent's --servers credentials
        import orjson

        options["server_auth"] = {url: tuple(cred) for url, cred in orjson.loads(auth).items()}
    options["tokenizer_loader"] = os.environ.get(LOADER_ENV) or "auto"
    return build_config(**options)


def main(args: argparse.Namespace) -> int:
    """Run `generate` from parsed flags (modes.run_command chooses how); print the summary."""
    from ..engine.summary import describe
    from ..modes import run_command
    from ..runtime import quiet_streams, say

    config = config_from_args(args)
    with quiet_streams():  # a closed stdout or stderr must not lose a stop, nor the summary on disk
        outcome = run_command(config, args.argv, args.parent_fd)
        print(describe(outcome, config.out))
        if outcome.error is not None:
            say(f"error: {outcome.error}")
    return outcome.exit_code
