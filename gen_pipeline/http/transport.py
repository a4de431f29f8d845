"""The aiohttp transport (`--http-client aiohttp`): the same contract as http11.Http11Transport over one
aiohttp session, and the one place where aiohttp's exceptions become ours. Imported only when chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import aiohttp

from ..errors import ConnectionLostError, RequestError, RequestTimeout
from ..http11 import KEEPALIVE_TIMEOUT, Response, connect_failure, describe


@contextlib.contextmanager
def map_errors(server: str) -> Iterator[None]:
    """Translate aiohttp and socket errors into ours, most specific first."""
    try:
        yield
    except RequestError:
        raise
    except aiohttp.ClientConnectorError as exc:
        raise connect_failure(exc.errno, describe(exc), server) from exc  # its os_error's errno
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise RequestTimeout("request timed out", server=server) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise ConnectionLostError(f"connection lost: {describe(exc)}", server=server) from exc
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        raise ConnectionLostError(f"connection failed: {describe(exc)}", server=server) from exc


class AiohttpTransport:
    """The same contract over one aiohttp session (`--http-client aiohttp`)."""

    def __init__(self, api_key: str | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_TIMEOUT)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        timeout = aiohttp.ClientTimeout(total=None)
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout)

    async def __aenter__(self) -> AiohttpTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, server: str, path: str, timeout: float, body: bytes | None = None) -> Response:
        headers = {"Content-Type": "application/json"} if body is not None else None
        with map_errors(server):
            async with (
                asyncio.timeout(timeout),
                self.session.request(method, server + path, data=body, headers=headers) as resp,
            ):
                return resp.status, await resp.read(), {k.lower(): v for k, v in resp.headers.items()}
