"""Finding out what the fleet serves: model name, context length, tokenizer, and who is up.

SGLang puts the effective context length in `/v1/models` `max_model_len` and the tokenizer in
`/model_info` `tokenizer_path`; llama.cpp puts the per-slot context in `/v1/models` `data[0].meta.n_ctx`.
The server kind (sglang, vllm, llamacpp: it decides how content parts are joined before the template
renders them) is the model card's `owned_by`; a server whose card does not say is SGLang when it has
`/model_info` or `/server_info`, llama.cpp when it has `/props`. What checkpoint each serves (its
identity: provenance.py) comes from the same answers, plus llama.cpp's `/props` and vLLM's `/version`.

SGLang's running slots: `/server_info` `max_running_requests` when the server was started with
`--max-running-requests` ("reported"); else (null there, 0.5.23) the scheduler's own figure from `/v1/loads`
`loads[0].max_running_requests` ("loads endpoint") or `/server_info` `internal_states[0]
.effective_max_running_requests_per_dp` ("scheduler state"). Its KV token pool (`max_total_num_tokens`) and
input cap (`max_req_input_len`) are kept too: capacity.py decides from them. llama.cpp reports its slots as
`/props` `total_slots` ("reported"); vLLM reports none. Where a server's running and waiting requests can be
read is kept as `ServerInfo.loads` (a loads.LoadSource): SGLang's `/v1/loads` when its first rank has them,
vLLM's `/metrics` when its Prometheus text has `vllm:num_requests_running` and `vllm:num_requests_waiting`;
None for llama.cpp and any other. Only the servers with one are polled for their load during the run
(fleet/loads.py), and their capacity follows it. SGLang's grammar backend and its whitespace settings are
kept too (`ServerInfo.grammar`): structured.py judges from them what it does with a response_format.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import AuthError, EndpointError, FleetError, RequestError, RetryableError
from ..http import Client
from ..tokens.conversation import SERVER_KINDS
from .loads import fetch_load
from .provenance import ServerIdentity, fleet_warnings, identity_from
from .state import LOAD_SOURCES, LoadSource
from .structured import Grammar, asks_for_json, findings

log = logging.getLogger("gen_pipeline")

DISCOVERY_TIMEOUT = 10.0
POLL_INTERVAL = 1.0
WAIT_NOTE_S = 15.0  # how often the wait for the servers at start is said


@dataclass(frozen=True)
class ServerInfo:
    """What one server says about itself."""

    url: str
    model: str | None
    context_length: int | None
    tokenizer_path: str | None = None
    max_running_requests: int | None = None
    kind: str | None = None  # "sglang", "vllm" or "llamacpp" (server_kind), else the card's owned_by, or None
    identity: ServerIdentity | None = None  # the checkpoint it serves, as far as it says (provenance.py)
    running_source: str | None = None  # where max_running_requests came from (see the module docstring)
    max_total_num_tokens: int | None = None  # SGLang's KV pool: what an admitted request reserves comes from it
    max_req_input_len: int | None = None  # SGLang refuses a prompt of this many tokens or more
    version: str | None = None
    loads: LoadSource | None = None  # where its running and waiting requests are read (None: nowhere, not watched)
    grammar: Grammar | None = None  # SGLang's constrained-decoding settings (structured.py), where it reports them


@dataclass
class FleetInfo:
    """What the whole fleet serves, and the servers that did not answer."""

    servers: list[ServerInfo]
    down: list[str]
    warnings: list[str] = field(default_factory=list)

    def models(self) -> set[str]:
        return {s.model for s in self.servers if s.model}

    def context_lengths(self) -> set[int]:
        return {s.context_length for s in self.servers if s.context_length}

    def input_limit(self) -> int | None:
        """The smallest input cap a server reports (SGLang's max_req_input_len: a prompt of this many tokens
        or more is refused); None when none reports one."""
        caps = [s.max_req_input_len for s in self.servers if s.max_req_input_len is not None]
        return min(caps) if caps else None

    def kind(self) -> str | None:
        """The one server kind the fleet reports (None: none, or several)."""
        kinds = self.spread("kind")
        return next(iter(kinds)) if len(kinds) == 1 else None

    def identities(self) -> list[tuple[str, ServerIdentity | None]]:
        """(url, identity) of every server that answered."""
        return [(s.url, s.identity) for s in self.servers]

    def spread(self, attr: str) -> dict[str, list[str]]:
        """The servers that answered, grouped by one ServerInfo field (servers that report none left out)."""
        groups: dict[str, list[str]] = {}
        for s in self.servers:
            if getattr(s, attr) is not None:
                groups.setdefault(str(getattr(s, attr)), []).append(s.url)
        return groups

    def response_format_findings(self, sampling: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Problems and warnings about what the servers do with the run's response_format, when it asks for
        JSON (structured.py): `check` reports them, `generate` refuses the problems unless --force."""
        problems: list[str] = []
        warnings: list[str] = []
        if asks_for_json(sampling):
            for s in self.servers:
                problem, warning = findings(s.url, s.kind, s.grammar)
                problems += [problem] if problem else []
                warnings += [warning] if warning else []
        return problems, warnings

    def problems(self) -> list[str]:
        """Disagreements no run survives intact, one line each (`check` and `generate` both refuse them):
        servers serving different models (outputs mixed and mislabelled), or different context lengths."""
        found = []
        for attr, what in (("model", "models"), ("context_length", "context lengths (max_model_len)")):
            groups = self.spread(attr)
            if len(groups) > 1:
                found.append(f"servers report different {what}: {groups}")
        return found


def _card_context(card: dict[str, Any]) -> int | None:
    if isinstance(card.get("max_model_len"), int):
        return int(card["max_model_len"])
    meta = card.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("n_ctx"), int):
        return int(meta["n_ctx"])
    return None


async def _optional(client: Client, url: str, path: str) -> dict[str, Any]:
    try:
        body = await client.get_json(url, path, DISCOVERY_TIMEOUT)
    except RetryableError:
        raise
    except RequestError:
        return {}  # an endpoint this server does not have
    return body if isinstance(body, dict) else {}


async def probe(client: Client, url: str) -> ServerInfo:
    """Ask one server for its model card, model info and server info."""
    models = await client.get_json(url, "/v1/models", DISCOVERY_TIMEOUT)
    cards = models.get("data") if isinstance(models, dict) else None
    card = cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}
    info = await _optional(client, url, "/model_info")
    server = await _optional(client, url, "/server_info")
    kind = server_kind(card, info or server)
    extra = await _optional(client, url, _IDENTITY_PATHS[kind]) if kind in _IDENTITY_PATHS else {}
    if kind is None and (extra := await _optional(client, url, "/props")):
        kind = "llamacpp"
    running, source = _positive(server.get("max_running_requests") or extra.get("total_slots")), "reported"
    load = _first((await _optional(client, url, "/v1/loads")).get("loads")) if kind == "sglang" else {}
    if running is None and kind == "sglang":
        running, source = _scheduler_slots(load, server)
    return ServerInfo(
        url=url,
        model=card.get("id"),
        context_length=_card_context(card),
        tokenizer_path=info.get("tokenizer_path") or server.get("tokenizer_path"),
        max_running_requests=running,
        kind=kind if kind is not None else _text(card.get("owned_by")),
        running_source=source if running is not None else None,
        max_total_num_tokens=_positive(server.get("max_total_num_tokens")),
        max_req_input_len=_positive(server.get("max_req_input_len")),
        version=_text(server.get("version")),
        identity=identity_from(kind, card, info, server, extra),
        loads=await _load_source(client, url, kind, load),
        grammar=Grammar.from_server_info(server) if kind == "sglang" else None,
    )


# Where a server kind reports what /model_info and /server_info do not: its checkpoint file, its version.
_IDENTITY_PATHS = {"llamacpp": "/props", "vllm": "/version"}


async def _load_source(client: Client, url: str, kind: str | None, sglang_load: dict[str, Any]) -> LoadSource | None:
    """Where this server's load can be watched: SGLang's /v1/loads when its first rank (read above) has the
    counts; vLLM's /metrics when it answers with its series (any status but 200: it has none); else nowhere."""
    source = LOAD_SOURCES.get(kind or "")
    if source is LoadSource.SGLANG:
        return source if "num_running_reqs" in sglang_load else None
    if source is None:
        return None
    try:
        found = await fetch_load(client, url, source, DISCOVERY_TIMEOUT)
    except RetryableError:
        raise
    except RequestError:
        return None  # no such endpoint (a 404), or it refuses us
    return source if found is not None else None


def _scheduler_slots(load: dict[str, Any], server: dict[str, Any]) -> tuple[int | None, str]:
    """The scheduler's running slots when /server_info says null: /v1/loads (its first rank's `load`), else its
    internal state."""
    if (running := _positive(load.get("max_running_requests"))) is not None:
        return running, "loads endpoint"
    state = _first(server.get("internal_states"))
    return _positive(state.get("effective_max_running_requests_per_dp")), "scheduler state"


def _first(items: Any) -> dict[str, Any]:
    """The first DP rank's object of a list SGLang gives per rank ({} when there is none)."""
    return items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def server_kind(card: dict[str, Any], sglang_info: dict[str, Any]) -> str | None:
    """sglang, vllm or llamacpp from the model card's owned_by, else SGLang's own endpoints; None: unknown."""
    owned = card.get("owned_by")
    if owned in SERVER_KINDS:
        return str(owned)
    return "sglang" if sglang_info else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def _probe_all(client: Client, urls: tuple[str, ...]) -> tuple[list[ServerInfo], dict[str, str]]:
    """The servers that answered, and why each other one did not (by URL)."""
    results = await asyncio.gather(*(probe(client, u) for u in urls), return_exceptions=True)
    up, down = [], {}
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, AuthError):
            raise FleetError(f"{url} refused the API key ({result}); check --api-key")
        if isinstance(result, EndpointError):
            raise FleetError(str(result))
        if isinstance(result, BaseException):
            if not isinstance(result, RequestError):
                raise result
            down[url] = str(result)
        else:
            up.append(result)
    return up, down


async def discover(client: Client, urls: tuple[str, ...], startup_timeout: float) -> FleetInfo:
    """Probe every server; wait (up to startup_timeout) until at least one answers, saying so every WAIT_NOTE_S
    with why the first one does not answer (a line every second said only how many were down)."""
    start = time.monotonic()
    said = -math.inf
    while True:
        up, down = await _probe_all(client, urls)
        if up:
            break
        waited = time.monotonic() - start
        first = next(iter(down.items()))
        if waited >= startup_timeout:
            raise FleetError(
                f"no server answered within {startup_timeout:.0f} s: {', '.join(urls)} ({first[0]}: {first[1]})"
            )
        if waited - said >= WAIT_NOTE_S:
            said = waited
            log.info(
                "waiting for servers to come up: %d down (%s: %s); %.0f s of --startup-timeout left",
                len(down), *first, startup_timeout - waited,
            )  # fmt: skip
        await asyncio.sleep(POLL_INTERVAL)
    fleet = FleetInfo(servers=up, down=list(down))
    fleet.warnings.extend(fleet_warnings(fleet.identities()))
    if down:
        fleet.warnings.append(f"{len(down)} server(s) not answering at start: {', '.join(down)}")
    return fleet
