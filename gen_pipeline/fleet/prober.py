"""Active probes of the servers that are out of service (the decisions about them are in health.py).

While a server is out, it is probed every PROBE_INTERVAL seconds with `GET /v1/models`: that answers at
once on SGLang, vLLM and llama.cpp (SGLang's `/health` takes at least a second and says 503 while warming
up, although `/v1/*` already serves), and fails with "connection refused" while a server restarts.

A server that was down at start has told nothing of what it serves: when it first answers, it is asked
(discovery.probe), and it comes in only when it serves one of the identities the fleet's other servers reported
(and the manifest lists); otherwise it is retired, so that no line names a checkpoint the manifest does not.
A server that comes back from an outage is asked again: restarted as anything else (another checkpoint, a new
`model_path` under the same served name, a `weight_version` left at SGLang's "default"; another served name;
another setting that changes outputs), it is retired, so that none of its answers is written under the
identity it had before. With every server retired the run stops (exit 1), as when every answer reports a new
weight_version.
"""

from __future__ import annotations

import asyncio
import logging

from ..errors import RequestError
from ..http import Client
from .balancer import ServerPool
from .discovery import probe
from .state import ServerState

log = logging.getLogger("gen_pipeline")

PROBE_INTERVAL = 1.0
PROBE_TIMEOUT = 3.0


async def probe_once(client: Client, server: ServerState, pool: ServerPool | None = None) -> bool:
    """Whether the server answers its model list now (and, with `pool`, serves what the fleet serves)."""
    try:
        await client.get_json(server.url, "/v1/models", PROBE_TIMEOUT)
    except RequestError:
        return False
    return pool is None or await identify(client, server, pool)


async def identify(client: Client, server: ServerState, pool: ServerPool) -> bool:
    """Learn what a server coming (back) into service serves. One down at start must serve an identity of
    the fleet's servers; one that had an identity must serve the same. Otherwise it is retired."""
    try:
        found = (await probe(client, server.url)).identity
    except RequestError:
        return False
    before = server.identity
    if before is not None:
        # the whole identity: its served name and the settings that change outputs (deterministic inference,
        # quantization) too, or its rows would be written under the fingerprint it had before
        if found is None or found.fingerprint == before.fingerprint:
            return True
        log.warning(
            "%s came back serving %s, not %s as before (redeployed while out of service: %s): left out of the run",
            server.url,
            found.label(),
            before.label(),
            before.changes(found),
        )
        pool.retire(server)
        return False
    known = {s.identity.fingerprint for s in pool.servers if s.identity is not None}
    if found is None or not known or found.fingerprint in known:
        server.identity = found
        return True
    log.warning(
        "%s came up serving %s, not what this run's servers serve: left out of the run", server.url, found.label()
    )
    pool.retire(server)
    return False


async def watch_servers(pool: ServerPool, client: Client, interval: float = PROBE_INTERVAL) -> None:
    """Probe every out-of-service server, forever (the pipeline cancels this task)."""
    while True:
        out = pool.out_of_service()
        if out:
            results = await asyncio.gather(*(probe_once(client, s, pool) for s in out))
            for server, ok in zip(out, results, strict=True):
                pool.record_probe(server, ok, interval)
        await asyncio.sleep(interval)
