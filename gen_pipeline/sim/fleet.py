"""Start and stop a whole simulated fleet inside the running event loop."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import TracebackType

from ..errors import ConfigError
from ..tokens import FastTokenCounter, HFTokenCounter, light_parts, load_tokenizer
from ..tokens.render import ChatTemplate
from .config import QWEN_EOS_ID, SimConfig
from .counting import ServerCounter
from .scheduler import PortStats
from .server import PortServer


class SimFleet:
    """Simulated SGLang servers, one per configured port; an async context manager."""

    def __init__(self, config: SimConfig, servers: dict[int, PortServer]) -> None:
        self.config = config
        self.servers = servers
        dead = {port: PortStats() for port in config.dead}  # a dead port's counters stay at zero
        self.stats: dict[int, PortStats] = {p: servers[p].stats if p in servers else dead[p] for p in config.ports}

    @property
    def urls(self) -> list[str]:
        """The base URL of every configured port, dead ones included, in config order."""
        return [f"http://127.0.0.1:{port}" for port in self.config.ports]

    async def aclose(self) -> None:
        """Stop every port (idempotent)."""
        await asyncio.gather(*(server.aclose() for server in self.servers.values()))

    async def __aenter__(self) -> SimFleet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def start_fleet(config: SimConfig) -> SimFleet:
    """Load the tokenizer once and start listening on every live port of `config`."""
    counter = await asyncio.to_thread(load_tokenizer, config.tokenizer)
    eos = counter.tokenizer.eos_token_id
    eos = QWEN_EOS_ID if eos is None else int(eos)
    light = light_counter(config, counter) if config.light_template else None
    server_counter = ServerCounter(counter, config.template_extra_tokens, light)
    servers = {port: PortServer(config, port, server_counter, eos) for port in config.live_ports}
    fleet = SimFleet(config, servers)
    for port, server in servers.items():
        try:
            await server.start()
        except OSError as exc:
            await fleet.aclose()
            raise ConfigError(f"simulator: cannot listen on 127.0.0.1:{port}: {exc}") from exc
    return fleet


def light_counter(config: SimConfig, counter: HFTokenCounter) -> FastTokenCounter:
    """The loaded tokenizer's own Rust tokenizer with the folder's template rendered by ChatTemplate."""
    folder = Path(config.tokenizer)
    parts = light_parts(folder) if folder.is_dir() else None
    if parts is None:
        raise ConfigError(
            f"simulator: --light-template needs a tokenizer folder with tokenizer.json, tokenizer_config.json and "
            f"one chat template, and no special_tokens_map.json; {config.tokenizer!r} is not one"
        )
    try:
        template = ChatTemplate(*parts)
    except Exception as exc:  # a template jinja cannot compile
        raise ConfigError(f"simulator: cannot compile the chat template of {config.tokenizer!r}: {exc}") from exc
    return FastTokenCounter(counter.tokenizer.backend_tokenizer, template, config.tokenizer, whole=True)


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
