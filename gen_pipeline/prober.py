"""Active probes of the servers that are out of service (the decisions about them are in health.py).

While a server is out, it is probed every PROBE_INTERVAL seconds with `GET /v1/models`: that answers at
once on SGLang, vLLM and llama.cpp (SGLang's `/health` takes at least a second and says 503 while warming
up, although `/v1/*` already serves), and fails with "connection refused" while a server restarts.
"""

from __future__ import annotations

import asyncio

from .balancer import ServerPool
from .errors import RequestError
from .http import Client
from .serverstate import ServerState

PROBE_INTERVAL = 1.0
PROBE_TIMEOUT = 3.0


async def probe_once(client: Client, server: ServerState) -> bool:
    """Whether the server answers its model list now."""
    try:
        await client.get_json(server.url, "/v1/models", PROBE_TIMEOUT)
    except RequestError:
        return False
    return True


async def watch_servers(pool: ServerPool, client: Client, interval: float = PROBE_INTERVAL) -> None:
    """Probe every out-of-service server, forever (the pipeline cancels this task)."""
    while True:
        out = pool.out_of_service()
        if out:
            results = await asyncio.gather(*(probe_once(client, s) for s in out))
            for server, ok in zip(out, results, strict=True):
                pool.record_probe(server, ok, interval)
        await asyncio.sleep(interval)
