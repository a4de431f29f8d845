"""What one attempt carries for its server beyond the request: a rid, and the weights a stream does not name.

An attempt on an SGLang server carries a `rid` of its own, so the client can stop it by that rid when it gives
up on it (http/client.py). Rids are unique in the run (a tag of the process, the row's key, a counter), and
each ends with "." so none is the beginning of another: SGLang's scheduler aborts every rid that begins with
the one asked for (a request with n > 1 runs as rid_0, rid_1, ...).

A whole SGLang answer names its weights (`metadata.weight_version`, as they were at its end); the chunks of a
streamed one carry no metadata (SGLang 0.5.23). So a streamed answer from a server that reported a
weight_version at start is given the one its `/model_info` reports in a read sent after the answer ended: the
weights then are those at its end or later, so a redeploy mid-answer is never missed (one just after it only
sends the row elsewhere). A server is read one read at a time, and every answer that ended before a read was
sent shares it: under load, far fewer reads than answers.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from ..errors import ConnectionLostError, RequestError
from ..fleet.state import ServerState
from ..http import Client

INFO_PATH = "/model_info"

Read = tuple[str | None, RequestError | None]  # the version read (None: not reported), or why it failed


class Rids:
    """The rids of one process's attempts."""

    def __init__(self) -> None:
        self._tag = os.urandom(4).hex()  # this process's rids apart from another's, and from a rerun's
        self._count = itertools.count(1)

    def base(self, key: int) -> str:
        """The start of the rids of a row's attempts (its id key)."""
        return f"gp-{self._tag}-{key & 0xFFFFFFFFFFFFFFFF:016x}"

    def wire(self, payload: dict[str, Any], base: str, server: ServerState) -> dict[str, Any]:
        """What is sent: the payload, with a rid of its own on an SGLang server."""
        if server.identity is None or server.identity.kind != "sglang":
            return payload
        return {**payload, "rid": f"{base}-{next(self._count)}."}


class WeightVersions:
    """A server's current weight_version, read for answers that ended before the read was sent."""

    def __init__(self, client: Client, timeout: float) -> None:
        self.client, self.timeout = client, timeout
        self._next: dict[str, asyncio.Future[Read]] = {}  # the read each server sends next, and its waiters
        self._reading: dict[str, asyncio.Task[None]] = {}

    async def current(self, server: str) -> str | None:
        """The weight_version `server` reports in a read sent after this call; the read's error if it fails."""
        waiter = self._next.get(server)
        if waiter is None:
            waiter = self._next[server] = asyncio.get_running_loop().create_future()
            if server not in self._reading:
                self._reading[server] = asyncio.get_running_loop().create_task(self._read(server))
        version, error = await asyncio.shield(waiter)
        if error is not None:
            raise error
        return version

    async def _read(self, server: str) -> None:
        """Send reads back to back while answers wait for one."""
        try:
            while (waiter := self._next.pop(server, None)) is not None:
                try:
                    waiter.set_result(await self._one(server))
                finally:
                    if not waiter.done():  # the read was cancelled: its waiters must not wait forever
                        waiter.set_result((None, ConnectionLostError("weight_version read cancelled", server=server)))
        finally:
            del self._reading[server]

    async def _one(self, server: str) -> Read:
        try:
            info: Any = await self.client.get_json(server, INFO_PATH, self.timeout)
        except RequestError as exc:
            return None, exc
        version = info.get("weight_version") if isinstance(info, dict) else None
        return (version if isinstance(version, str) else None), None
