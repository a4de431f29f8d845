"""Finding out what the fleet serves: model name, context length, tokenizer, and who is up.

SGLang puts the effective context length in `/v1/models` `max_model_len` and the tokenizer in
`/model_info` `tokenizer_path`; llama.cpp puts the per-slot context in `/v1/models` `data[0].meta.n_ctx`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import AuthError, EndpointError, FleetError, RequestError, RetryableError
from .http import Client

log = logging.getLogger("gen_pipeline")

DISCOVERY_TIMEOUT = 10.0
POLL_INTERVAL = 1.0


@dataclass(frozen=True)
class ServerInfo:
    """What one server says about itself."""

    url: str
    model: str | None
    context_length: int | None
    tokenizer_path: str | None = None
    max_running_requests: int | None = None


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
    running = server.get("max_running_requests")
    return ServerInfo(
        url=url,
        model=card.get("id"),
        context_length=_card_context(card),
        tokenizer_path=info.get("tokenizer_path") or server.get("tokenizer_path"),
        max_running_requests=running if isinstance(running, int) and running > 0 else None,
    )


async def _probe_all(client: Client, urls: tuple[str, ...]) -> tuple[list[ServerInfo], list[str]]:
    results = await asyncio.gather(*(probe(client, u) for u in urls), return_exceptions=True)
    up, down = [], []
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, AuthError):
            raise FleetError(f"{url} refused the API key ({result}); check --api-key")
        if isinstance(result, EndpointError):
            raise FleetError(str(result))
        if isinstance(result, BaseException):
            if not isinstance(result, RequestError):
                raise result
            down.append(url)
        else:
            up.append(result)
    return up, down


async def discover(client: Client, urls: tuple[str, ...], startup_timeout: float) -> FleetInfo:
    """Probe every server; wait (up to startup_timeout) until at least one answers."""
    deadline = time.monotonic() + startup_timeout
    while True:
        up, down = await _probe_all(client, urls)
        if up:
            break
        if time.monotonic() >= deadline:
            raise FleetError(f"no server answered within {startup_timeout:.0f} s: {', '.join(urls)}")
        log.info("waiting for servers to come up (%d down)", len(down))
        await asyncio.sleep(POLL_INTERVAL)
    fleet = FleetInfo(servers=up, down=down)
    if down:
        fleet.warnings.append(f"{len(down)} server(s) not answering at start: {', '.join(down)}")
    if len(fleet.models()) > 1:
        fleet.warnings.append(f"servers serve different models: {sorted(fleet.models())}")
    if len(fleet.context_lengths()) > 1:
        fleet.warnings.append(
            f"servers report different context lengths {sorted(fleet.context_lengths())}; budgeting with the smallest"
        )
    return fleet
