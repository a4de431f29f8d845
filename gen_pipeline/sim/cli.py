"""`gen-pipeline simulate`: flags -> SimConfig, then serve until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from ..config import parse_ports as config_parse_ports
from ..errors import ConfigError, PipelineError
from ..tokens import TINY_TOKENIZER
from .config import INVALID_ANSWERS, SimConfig
from .fleet import SimFleet, start_fleet

T = TypeVar("T")
DESCRIPTION = "Serve simulated SGLang servers on 127.0.0.1 until SIGINT or SIGTERM."


def parse_ports(text: str) -> tuple[int, ...]:
    """Ports from "30000-30007", "30000,30002" or a mix of both (an argparse type over config.parse_ports)."""
    try:
        ports = config_parse_ports(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"not a port list: {text!r} ({exc}; e.g. 30000-30007,30010)") from None
    if not ports:
        raise argparse.ArgumentTypeError(f"not a port list: {text!r}")
    return tuple(ports)


def _pair(value_type: Callable[[str], T]) -> Callable[[str], tuple[int | None, T]]:
    """An argparse type for "PORT:VALUE" (or a bare "VALUE", port None)."""

    def parse(text: str) -> tuple[int | None, T]:
        port, _, value = text.rpartition(":")
        try:
            return (int(port) if port else None), value_type(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected PORT:VALUE, got {text!r}") from None

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags to `parser`."""
    add = parser.add_argument
    add(
        "--ports",
        type=parse_ports,
        required=True,
        help="ports to serve, e.g. 31000-31007 or 31000,31002",
    )
    add("--context-length", type=int, default=8192, help="context length (max_model_len)")
    add(
        "--tokenizer",
        default=str(TINY_TOKENIZER),
        help="tokenizer folder whose chat template counts prompts",
    )
    add("--model", default="sim-model", help="served model name")
    add(
        "--light-template",
        action="store_true",
        help="render chat prompts with gen_pipeline's own template renderer (same text as transformers, "
        "~0.1 ms less CPU a request; the folder needs tokenizer.json and its chat template)",
    )
    add("--max-running", type=int, default=64, help="requests run at once per port; the rest queue")
    add(
        "--max-queued",
        type=int,
        default=None,
        help="queue bound per port; beyond it 503 (default unbounded)",
    )
    add("--max-total-tokens", type=int, default=None, help="KV pool size (default 8 contexts)")
    add(
        "--kv-admission",
        action="store_true",
        help="admit a request only when its prompt + max_tokens (clipped at 4096) fit in the KV pool beside the "
        "running ones, as SGLang does; the rest queue (default: only --max-running bounds concurrency)",
    )
    add("--token-latency", type=float, default=0.0, help="seconds per generated token")
    add("--prefill-latency", type=float, default=0.0, help="seconds added once per request")
    add("--prompt-token-latency", type=float, default=0.0, help="seconds per prompt token (prefill)")
    add("--health-delay", type=float, default=1.0, help="seconds /health takes (SGLang: >= 1)")
    add(
        "--template-extra-tokens",
        type=int,
        default=0,
        help="tokens the server's template adds to each chat prompt",
    )
    add(
        "--reserved-tokens",
        type=int,
        default=0,
        help="EAGLE reserve added to the input of checks A and B",
    )
    add(
        "--legacy-offbyone",
        action="store_true",
        help="SGLang <= 0.5.9: reject input + max_tokens >= ctx",
    )
    add("--explicit-context-length", action="store_true", help="as if --context-length was passed to SGLang")
    add(
        "--report-max-running",
        action="store_true",
        help="as if --max-running-requests was passed: /server_info reports it (else null, as SGLang 0.5.23)",
    )
    add("--cache-report", action="store_true", help="as if --enable-cache-report: usage carries cached_tokens")
    add(
        "--completion-words",
        type=int,
        default=48,
        help="upper bound of the natural completion length",
    )
    parser.add_argument(
        "--reasoning-words",
        type=int,
        default=0,
        help="up to this many words of reasoning_content in each chat reply, as with SGLang's --reasoning-parser "
        "(default 0: null)",
    )
    add("--seed", type=int, default=0, help="seed of completions and fault draws")
    add(
        "--prefix-cache", type=int, default=0, help="prompt prefixes per port whose prefill is cached (default 0: none)"
    )
    add(
        "--prefix-cache-tokens",
        type=int,
        default=0,
        help="tokens per port of SGLang's radix cache: prefill paid only past a prompt's longest cached prefix "
        "(default 0: none)",
    )
    add("--request-log", help="append one JSON line per answered chat request to this file")
    _add_fault_arguments(parser)
    _add_provenance_arguments(parser)


def _redeploy(text: str) -> tuple[int | None, tuple[int, str]]:
    """An argparse type for "[PORT:]N:VERSION"."""
    parts = text.split(":")
    try:
        if len(parts) == 2:
            return None, (int(parts[0]), parts[1])
        if len(parts) == 3 and parts[2]:
            return int(parts[0]), (int(parts[1]), parts[2])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected [PORT:]N:VERSION, got {text!r}")


def _add_provenance_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags that set what checkpoint the servers report."""
    group = parser.add_argument_group("provenance")
    add = group.add_argument
    add("--model-path", help="the model_path reported (default: the tokenizer folder)")
    add("--weight-version", default="default", help="the weight_version reported (default: default)")
    add("--server-version", help="the SGLang version reported (default 0.5.23, 0.5.9 with --legacy-offbyone)")
    add("--deterministic", action="store_true", help="report enable_deterministic_inference true")
    add(
        "--redeploy-after",
        type=_redeploy,
        action="append",
        default=[],
        metavar="[PORT:]N:VERSION",
        help="after N generation requests the port (default: the first live one) serves weight_version VERSION",
    )


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the fault-injection flags."""
    group = parser.add_argument_group("fault injection")
    add = group.add_argument
    add("--dead", type=parse_ports, default=(), help="ports that never listen")
    add(
        "--flaky",
        type=_pair(float),
        action="append",
        default=[],
        metavar="PORT:P",
        help="500/502 on a fraction P",
    )
    add(
        "--bad-gateway",
        type=_pair(float),
        action="append",
        default=[],
        metavar="PORT:P",
        help="an instant 502 (before any work) on a fraction P",
    )
    add(
        "--slow",
        type=_pair(float),
        action="append",
        default=[],
        metavar="PORT:FACTOR",
        help="latencies x FACTOR",
    )
    add("--p500", type=float, default=0.0, help="fraction of requests answered 500 (every port)")
    add("--p503", type=float, default=0.0, help="fraction answered 503 queue full (every port)")
    add("--p-drop", type=float, default=0.0, help="fraction whose connection is reset with no reply")
    add("--p-hang", type=float, default=0.0, help="fraction never answered")
    add("--template-error", metavar="MESSAGE", help="answer every chat request 400 with MESSAGE (a broken template)")
    add("--poison", metavar="TEXT", help="answer every request whose prompt contains TEXT with --poison-status")
    add("--poison-status", type=int, default=500, help="the status --poison answers (default 500)")
    add(
        "--crash-after",
        type=_pair(int),
        action="append",
        default=[],
        metavar="[PORT:]N",
        help="the port (default: the first live one) crashes on its generation request N+1",
    )
    add(
        "--restart-after",
        type=float,
        default=None,
        help="a crashed port listens again after SECONDS",
    )
    add("--warmup", type=float, default=2.0, help="after a restart, /health answers 503 for SECONDS")
    add(
        "--invalid",
        type=_invalid,
        action="append",
        default=[],
        metavar="KIND:P",
        help=f"turn a fraction P of the answers into invalid ones: {', '.join(INVALID_ANSWERS)} (seeded by the "
        "request's seed when it has one)",
    )
    add("--json-answers", action="store_true", help="answer every chat request with JSON (else only response_format)")
    add("--p-loop", type=float, default=0.0, help="fraction of chat answers that loop to max_tokens (seeded)")
    add("--loop-period", type=int, default=48, help="a loop repeats a unit of 1 to N words (default 48)")
    add("--stream-interval", type=int, default=1, help="tokens per streamed chunk (default 1, as SGLang's)")


def _invalid(text: str) -> tuple[str, float]:
    """KIND:P of --invalid."""
    kind, _, p = text.rpartition(":")
    try:
        return kind, float(p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KIND:P (e.g. prose:0.05), got {text!r}") from None


def _by_port(pairs: list[tuple[int | None, Any]], default_port: int, flag: str) -> dict[int, Any]:
    """{port: value} from parsed PORT:VALUE pairs; a bare value goes to `default_port`."""
    if any(port is None for port, _ in pairs) and flag not in ("--crash-after", "--redeploy-after"):
        raise ConfigError(f"simulator: {flag} needs PORT:VALUE, got a bare value")
    return {default_port if port is None else port: value for port, value in pairs}


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The SimConfig the flags describe."""
    live = [p for p in args.ports if p not in set(args.dead)] or list(args.ports)
    return SimConfig(
        ports=args.ports,
        context_length=args.context_length,
        tokenizer=args.tokenizer,
        model=args.model,
        light_template=args.light_template,
        max_running=args.max_running,
        report_max_running=args.report_max_running,
        max_queued=args.max_queued,
        max_total_tokens=args.max_total_tokens,
        kv_admission=args.kv_admission,
        token_latency=args.token_latency,
        prefill_latency=args.prefill_latency,
        prompt_token_latency=args.prompt_token_latency,
        health_delay=args.health_delay,
        template_extra_tokens=args.template_extra_tokens,
        reserved_tokens=args.reserved_tokens,
        legacy_offbyone=args.legacy_offbyone,
        explicit_context_length=args.explicit_context_length,
        cache_report=args.cache_report,
        completion_words=args.completion_words,
        reasoning_words=args.reasoning_words,
        seed=args.seed,
        prefix_cache=args.prefix_cache,
        prefix_cache_tokens=args.prefix_cache_tokens,
        request_log=args.request_log,
        dead=args.dead,
        flaky=_by_port(args.flaky, live[0], "--flaky"),
        bad_gateway=_by_port(args.bad_gateway, live[0], "--bad-gateway"),
        slow=_by_port(args.slow, live[0], "--slow"),
        p500=args.p500,
        p503=args.p503,
        p_drop=args.p_drop,
        p_hang=args.p_hang,
        crash_after=_by_port(args.crash_after, live[0], "--crash-after"),
        restart_after=args.restart_after,
        warmup=args.warmup,
        model_path=args.model_path,
        weight_version=args.weight_version,
        server_version=args.server_version,
        deterministic=args.deterministic,
        redeploy=_by_port(args.redeploy_after, live[0], "--redeploy-after"),
        template_error=args.template_error,
        poison=args.poison,
        poison_status=args.poison_status,
        json_answers=args.json_answers,
        invalid=dict(args.invalid),
        p_loop=args.p_loop,
        loop_period=args.loop_period,
        stream_interval=args.stream_interval,
    )


def _port_line(config: SimConfig, port: int) -> str:
    """One startup line per port, naming its faults."""
    if port in config.dead:
        return f"port {port}: dead (not listening)"
    notes = [
        f"flaky {config.flaky[port]}" if port in config.flaky else "",
        f"bad gateway {config.bad_gateway[port]}" if port in config.bad_gateway else "",
        f"slow x{config.slow[port]}" if port in config.slow else "",
        f"crashes after {config.crash_after[port]} requests" if port in config.crash_after else "",
        f"weight_version {config.redeploy[port][1]} after {config.redeploy[port][0]} requests"
        if port in config.redeploy
        else "",
    ]
    extra = ", ".join(n for n in notes if n)
    return f"port {port}: listening on http://127.0.0.1:{port}" + (f" ({extra})" if extra else "")


def _summary(fleet: SimFleet) -> list[str]:
    """One line of counters per port, printed on shutdown."""
    keys = (
        "requests",
        "completions",
        "errors",
        "length_errors",
        "dropped",
        "hung",
        "max_in_flight",
        "max_running",
        "prefills",
        "prompt_tokens",
        "cached_tokens",
        "prefill_tokens",
        "output_tokens",
        "decoded_tokens",
        "loop_tokens",
        "stopped",
        "aborts",
        "busy_s",
        "model_s",
        "first_request_at",
        "last_reply_at",
        "slot_area_s",
        "first_full_at",
        "last_full_at",
        "area_at_first_full",
        "area_at_last_full",
    )
    return [f"port {port}: " + " ".join(f"{k}={asdict(stats)[k]}" for k in keys) for port, stats in fleet.stats.items()]


async def serve(config: SimConfig, out: Callable[[str], None]) -> int:
    """Run the fleet until SIGINT or SIGTERM, reporting through `out`."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with await start_fleet(config) as fleet:
        for port in config.ports:
            out(_port_line(config, port))
        out(f"simulator ready: {len(config.live_ports)} ports")
        await stop.wait()
        out("simulator stopping")
        for line in _summary(fleet):
            out(line)
    return 0


def _print(line: str) -> None:
    """Print one line and flush, so a parent process sees it at once."""
    print(line, flush=True)


def main(args: argparse.Namespace) -> int:
    """Entry point of `gen-pipeline simulate`: serve, and exit 0 on SIGINT/SIGTERM."""
    return asyncio.run(serve(config_from_args(args), _print))


def run_module(argv: list[str] | None = None) -> int:
    """`python -m gen_pipeline.simulator`: parse our own flags and serve."""
    parser = argparse.ArgumentParser(prog="python -m gen_pipeline.simulator", description=DESCRIPTION)
    add_arguments(parser)
    try:
        return main(parser.parse_args(argv))
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
