"""A raw asyncio HTTP server for transport tests: it answers with exact bytes (framing, resets and garbage
are what is under test) and counts the connections it was given."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gen_pipeline.http import AiohttpTransport

OK = b'{"ok": true}'
Reply = Callable[[int, asyncio.StreamWriter], Awaitable[None]]


def answer(body: bytes = OK, status: str = "200 OK", extra: bytes = b"") -> bytes:
    """One complete HTTP/1.1 answer with a Content-Length."""
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(),
        len(body),
        extra,
        body,
    )


class RawServer:
    """Counts connections, keeps each request's head and body, and lets `reply` write the answer."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                await self.reply(len(self.requests), writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def serve(reply: Reply, check: Callable[[AiohttpTransport, str], Awaitable[Any]], **transport: Any) -> RawServer:
    """Run `check(transport, url)` against a RawServer answering with `reply`, within a 20 s deadline."""
    server = RawServer(reply)

    async def main() -> None:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with AiohttpTransport("k", **transport) as t:
                await check(t, f"http://127.0.0.1:{port}")
        finally:
            srv.close()

    asyncio.run(asyncio.wait_for(main(), 20))
    return server


async def always_ok(n: int, writer: asyncio.StreamWriter) -> None:
    writer.write(answer())


async def never_answers(n: int, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)
