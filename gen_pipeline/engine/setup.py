"""Setting a run up: discover the fleet, resolve model, context and tokenizer, size the pool, settle
the manifest, and find where the input resumes. `generate`, `check` and the parent of `--workers` share it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import orjson

from .._version import __version__
from ..config import INTERNAL_FIELDS, RunConfig, redact
from ..errors import ConfigError, PreflightError
from ..fleet.affinity import PrefixModel
from ..fleet.balancer import ServerPool
from ..fleet.capacity import GUESS_GROWTH, guess_warning, server_capacity
from ..fleet.discovery import FleetInfo, discover
from ..fleet.pacing import queue_margin
from ..fleet.provenance import provenance_section, retired, seed_warning
from ..fleet.state import ServerState
from ..http import Client
from ..resume import cursor
from ..resume.changes import another_input
from ..resume.cursor import Resumed
from ..resume.settled import ResumeState, scan
from ..rundir.layout import read_manifest
from ..rundir.store import check_manifest
from ..runtime import open_file_limit
from ..tokens import TemplateIdentity, TokenCounter, load_counter, template_identity
from ..tokens.conversation import SERVER_KINDS
from ..tokens.whole import chat_template_hash

log = logging.getLogger("gen_pipeline")


# File descriptors kept for everything but request sockets: output, ledger, input, index, tokenizer files,
# the event loop's own, worker pipes.
RESERVED_FILES = 64


T = TypeVar("T")


def template_inputs_hash(config: RunConfig) -> str | None:
    """A SHA-256 of the run's tools and chat_template_kwargs (canonical JSON); None when it has neither."""
    if config.tools is None and config.chat_template_kwargs is None:
        return None
    inputs = {"tools": config.tools, "chat_template_kwargs": config.chat_template_kwargs}
    return hashlib.sha256(orjson.dumps(inputs, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def template_hash(text: str) -> str:
    """A SHA-256 of a --template's text (the manifest keeps it: another template is another prompt)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def manifest_for(
    config: RunConfig, model: str, ctx: int, counter: TemplateIdentity, server_kind: str | None = None
) -> dict[str, Any]:
    """The settings recorded with the run (never the API key)."""
    return {
        "model": model,
        "tokenizer": counter.name,
        "chat_template_sha256": chat_template_hash(counter),
        "template_inputs_sha256": template_inputs_hash(config),
        "server_kind": server_kind,
        "context_length": ctx,
        "sampling": config.sampling,
        "max_tokens": config.max_tokens,
        "min_tokens": config.min_tokens,
        "safety_margin": config.safety_margin,
        "samples": config.samples,
        **({"turns": config.turns} if config.turns != "last" else {}),
        "thinking_budget": config.thinking_budget,
        # the answer checks (the schema is in `sampling`, as response_format) and the resamples they allow
        **({"validate": list(config.validate)} if config.validate else {}),
        "max_resamples": config.max_resamples,
        "loop_guard": config.loop_guard,
        "system_prompt": config.system_prompt,
        **({"template_sha256": template_hash(config.template)} if config.template is not None else {}),
        "servers": list(config.servers),
        "input": str(config.input),
        "gen_pipeline_version": __version__,
        **({"shards": config.shards} if config.shards is not None else {}),
        "settings": settings_record(config),
    }


def settings_record(config: RunConfig) -> dict[str, Any]:
    """The run's effective options (from its flags, --config file or keywords) as `--config` keys name them,
    without the API key or server passwords (--servers are named without user:password@ already)."""
    hidden = INTERNAL_FIELDS | {"api_key", "retry"}
    record = {f.name: _plain(getattr(config, f.name)) for f in fields(config) if f.name not in hidden}
    record["max_attempts"] = config.retry.max_attempts
    if config.share > 1:  # a claimer started by --workers K (its own command line says --workers 1)
        record["workers"] = config.share
    if config.on_stall is not None:  # a command may name a URL with a password
        record["on_stall"] = redact(config.on_stall)
    return dict(sorted(record.items()))


def _plain(value: Any) -> Any:
    """A setting as JSON writes it: paths as text, sets sorted, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    return list(value) if isinstance(value, tuple) else value


def resolve(config: RunConfig, fleet: FleetInfo) -> tuple[str, int, str]:
    """Model name, context length and tokenizer: the flags when given, else what the fleet says."""
    model = config.model or next(iter(sorted(fleet.models())), None)
    if not model:
        raise ConfigError("the servers report no model id; pass --model")
    contexts = fleet.context_lengths()
    ctx = config.context_length or (min(contexts) if contexts else None)
    if not ctx:
        raise ConfigError("the servers report no context length; pass --context-length")
    if config.context_length and contexts and config.context_length > min(contexts):
        fleet.warnings.append(
            f"--context-length {config.context_length} exceeds the smallest server context "
            f"{min(contexts)}; expect context 400s"
        )
    if config.model and (served := fleet.models()) and config.model not in served:  # SGLang answers any name
        fleet.warnings.append(
            f"--model {config.model!r} is served by no server (their /v1/models: {', '.join(sorted(served))}); "
            "the servers answer anyway and every line records that name: check its spelling, or leave --model out"
        )
    tokenizer = config.tokenizer or next((s.tokenizer_path for s in fleet.servers if s.tokenizer_path), None)
    if not tokenizer:
        raise ConfigError("the servers report no tokenizer_path; pass --tokenizer")
    return model, ctx, tokenizer


def counting_kind(fleet: FleetInfo) -> str:
    """The server kind whose message normalisation the count follows: the fleet's, else SGLang's (with a
    warning when its servers are of several kinds: content parts may then count differently)."""
    kinds = fleet.spread("kind")
    if len(kinds) > 1:
        fleet.warnings.append(f"servers of different kinds {kinds}: counting as {fleet.servers[0].kind} does")
    kind = fleet.servers[0].kind if fleet.servers else None
    return kind if kind in SERVER_KINDS else "sglang"


def build_pool(config: RunConfig, fleet: FleetInfo, open_files: int | None = None) -> ServerPool:
    """One slot per request each server runs at once; servers down at start begin out of service.

    Every request in flight holds a socket: when the servers take more than this process's open-file limit
    allows (`ulimit -n`, read when `open_files` is None), every server's share shrinks to fit, with a
    warning, instead of failing connections that would then be blamed on the servers.
    """
    infos = {s.url: s for s in fleet.servers}
    found = {url: server_capacity(config, infos.get(url)) for url in config.servers}
    wanted = {url: config.capacity_for(c.requests) for url, c in found.items()}
    limit = open_file_limit() if open_files is None else open_files
    capacities, warning = fit_open_files(wanted, limit)
    if warning is not None:
        fleet.warnings.append(warning)
        log.warning("%s", warning)
    watched = {url for url, info in infos.items() if info.loads and not config.concurrency}
    guessed = [url for url, c in found.items() if c.source == "default" and url not in fleet.down]
    ceilings = _ceilings(capacities, [u for u in guessed if u in watched], watched, limit, warning)
    if (guess := guess_warning(guessed, ceilings)) is not None:
        fleet.warnings.append(guess)
    identity = {s.url: s.identity for s in fleet.servers}
    pool = ServerPool(
        ServerState(url, capacity, capacity_source=found[url].source, identity=identity.get(url))
        for url, capacity in capacities.items()
    )
    for server in pool.servers:
        # its load reports move its capacity (fleet/loads.py) up to its ceiling (the workers are sized for it)
        server.ceiling = ceilings.get(server.url)
        server.loads = infos[server.url].loads if server.url in watched else None
        server.margin, server.margin_follows = _margin(config, found[server.url].reported, server, warning)
        if (info := infos.get(server.url)) is not None:
            server.prefixes = PrefixModel(info.max_total_num_tokens)
        if server.url in fleet.down:
            pool.mark_down(server)
    return pool


def _ceilings(
    capacities: dict[str, int], guessed: list[str], watched: set[str], limit: int, warning: str | None
) -> dict[str, int]:
    """The most the load watcher may raise each watched server's capacity to: its start-up figure, or, where that
    is the default guess, GUESS_GROWTH times it while the open-file limit allows that many sockets."""
    ceilings = {url: c for url, c in capacities.items() if url in watched}
    grown = {url: ceilings[url] * GUESS_GROWTH for url in guessed}
    if grown and warning is None and fit_open_files({**capacities, **grown}, limit)[1] is None:
        ceilings.update(grown)
    return ceilings


def _margin(config: RunConfig, reported: int | None, server: ServerState, warning: str | None) -> tuple[int, bool]:
    """Requests to queue beyond the server's capacity, and whether that follows its capacity as the load watcher
    moves it: pacing.queue_margin where the server's own running slots set the capacity (it queues the rest) or
    its load is watched (its queue is seen); none when open files are short."""
    if warning is not None:
        return 0, False
    if config.queue_margin is not None:
        return config.queue_margin, False
    if config.concurrency or (reported is None and server.ceiling is None):
        return 0, False
    return queue_margin(server.capacity), True


def fit_open_files(capacities: dict[str, int], limit: int) -> tuple[dict[str, int], str | None]:
    """Each server's share of in-flight requests scaled down to fit `limit` open files, and the warning
    that says so (None when everything fits)."""
    sockets = max(len(capacities), limit - RESERVED_FILES)
    wanted = sum(capacities.values())
    if wanted <= sockets:
        return capacities, None
    fitted = {url: max(1, c * sockets // wanted) for url, c in capacities.items()}
    return fitted, (
        f"the servers take {wanted} requests at once but the open-file limit (ulimit -n) is {limit}: "
        f"keeping {sum(fitted.values())} in flight; raise the limit to use them all"
    )


def start_findings(config: RunConfig, fleet: FleetInfo) -> None:
    """Refuse, unless --force, a fleet `check` calls a PROBLEM; print the warnings now, not only at the end."""
    formats, warnings = fleet.response_format_findings(config.sampling)  # a server that refuses --json-schema
    problems = fleet.problems() + formats
    fleet.warnings.extend(warnings)
    if problems and not config.force:
        raise PreflightError(problems)
    fleet.warnings.extend(f"PROBLEM ignored (--force): {p}" for p in problems)
    if (seeded := seed_warning(fleet.identities(), config.sampling)) is not None:
        fleet.warnings.append(seeded)
    for warning in fleet.warnings:
        log.warning("warning: %s", warning)


async def settle_manifest(
    config: RunConfig, client: Client, counter: TokenCounter | None = None, during_load: Callable[[], T] | None = None
) -> tuple[FleetInfo, str, int, TokenCounter, T | None]:
    """Discover the fleet, load the tokenizer, and refuse (or record) the run's settings.

    `during_load()` (the resume scan) runs in another thread beside the tokenizer's load, and its result is
    returned. They take turns rather than overlap: tokenizers 0.23 holds the GIL for the whole load (~0.75 s
    for Qwen3's tokenizer.json; from_file, from_str and from_buffer alike), so only the scan's waits on the
    disk run beside it.
    """
    fleet = await discover(client, config.servers, config.startup_timeout)
    model, ctx, tokenizer = resolve(config, fleet)
    start_findings(config, fleet)
    kind = counting_kind(fleet)
    background = asyncio.ensure_future(asyncio.to_thread(during_load)) if during_load is not None else None
    try:
        if counter is None:
            counter = await asyncio.to_thread(load_counter, tokenizer, config.tokenizer_loader, kind)
        manifest = with_provenance(config, fleet, manifest_for(config, model, ctx, counter, fleet.kind()))
        for moved in [*input_warnings(config, manifest), *check_manifest(config.out, manifest, config.force)]:
            log.warning("warning: %s", moved)
            fleet.warnings.append(moved)
        extra = await background if background is not None else None
    except BaseException:
        if background is not None:
            background.cancel()
        raise
    return fleet, model, ctx, counter, extra


async def settle_settings(config: RunConfig, client: Client) -> None:
    """settle_manifest for the parent of `--workers K`: the tokenizer's vocabulary is left to the workers."""
    fleet = await discover(client, config.servers, config.startup_timeout)
    model, ctx, tokenizer = resolve(config, fleet)
    start_findings(config, fleet)
    identity = await asyncio.to_thread(template_identity, tokenizer, config.tokenizer_loader)
    manifest = with_provenance(config, fleet, manifest_for(config, model, ctx, identity, fleet.kind()))
    for moved in [*input_warnings(config, manifest), *check_manifest(config.out, manifest, config.force)]:
        log.warning("warning: %s", moved)  # the workers find the manifest already written: said here


def with_provenance(config: RunConfig, fleet: FleetInfo, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with the fleet's provenance merged into the run directory's (CheckpointChangedError:
    the servers serve a checkpoint the run's rows were not written by, and --accept-checkpoint is not set)."""
    old = read_manifest(config.out)
    return {**manifest, "provenance": provenance_section(old, fleet.identities(), config.accept_checkpoint)}


def retired_checkpoints(config: RunConfig, fleet: FleetInfo) -> frozenset[str]:
    """The checkpoints that wrote rows of the run directory and that the fleet no longer serves (the manifest
    as settle_manifest left it): a conversation they began is answered again, not gone on (engine.reader)."""
    return retired(read_manifest(config.out), fleet.identities())


def input_warnings(config: RunConfig, manifest: dict[str, Any]) -> list[str]:
    """The warning for a run directory resumed with another --input than its last run's (read before the
    manifest is written anew); none with --append-input, which adds another input's rows on purpose."""
    if config.append_input:
        return []
    before = read_manifest(config.out).get("input")
    warning = another_input(config.out, before, manifest.get("input"))
    return [warning] if warning is not None else []


def resume_state(config: RunConfig) -> ResumeState:
    """What earlier runs settled (read only: the run repairs torn tails itself, once it holds the directory)."""
    state = scan(config.out, repair=False)
    state.samples = config.samples
    state.turns = config.turns == "all"
    return state


def resume_point(config: RunConfig) -> tuple[ResumeState, Resumed | None]:
    """What earlier runs settled, and the input cursor when it still holds (where reading starts).

    A --limit run reads from the top and keeps no cursor: its N lines are counted from the first. So does
    --redo-changed: a changed row may lie before the mark (an earlier run said so and went on).
    """
    state = resume_state(config)
    if config.limit is not None or config.redo_changed:
        return state, None
    return state, cursor.load(config.out, config.input, config.retry_failed, state)
