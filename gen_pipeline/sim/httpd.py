"""The simulator's HTTP server: aiohttp's low-level web server, set up to behave as uvicorn in front of SGLang.

No router and no middleware: the handler gets every request (server.py routes them, with FastAPI's JSON 404
and 405). What is set here: keep-alive with uvicorn's idle timeout, a handler cancelled when its client goes
away (SGLang aborts that request), no access log, `server: uvicorn` on our replies, the interim 100 for
`Expect: 100-continue`, request bodies of any size, and a reset of every connection when a port is killed.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from . import sglang

KEEPALIVE_TIMEOUT = 5.0  # uvicorn's timeout_keep_alive, which SGLang keeps
SHUTDOWN_TIMEOUT = 0.5  # what a killed port waits for its (already reset) connections
SERVER_HEADER = {"Server": "uvicorn"}  # what SGLang's replies say, in place of aiohttp's own
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
HANG_SECONDS = 24 * 3600.0  # "never": the client gives up first, which cancels the handler
MEDIA_TYPE_ERROR = "Unsupported Media Type: Only 'application/json' is allowed"

Request = web.BaseRequest
Handler = Callable[[Request], Awaitable[web.StreamResponse]]


def json_response(body: Any, status: int = 200) -> web.Response:
    """A JSON reply serialised with orjson."""
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=SERVER_HEADER)


def empty_response(status: int) -> web.Response:
    """A reply with no body and no Content-Type, as Starlette's bare Response."""
    return web.Response(status=status, headers=SERVER_HEADER)


async def listen(handler: Handler, host: str, port: int) -> web.ServerRunner:
    """Serve `handler` on host:port (OSError when the address is taken)."""
    server = web.Server(handler, handler_cancellation=True, keepalive_timeout=KEEPALIVE_TIMEOUT, access_log=None)
    runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def kill(runner: web.ServerRunner) -> None:
    """Stop listening, then reset every open connection as a killed process would (their handlers are cancelled)."""
    for site in list(runner.sites):
        await site.stop()
    for conn in runner.server.connections if runner.server else []:
        if conn.transport is not None:
            conn.transport.abort()
    await asyncio.sleep(0)  # let connection_lost run, which cancels their handlers
    await runner.cleanup()


def reset(request: Request) -> None:
    """Reset the request's connection (a TCP RST: SO_LINGER 0): its client sees the reset and no reply, which a
    clean close of a kept-alive connection would not tell it (that one it may take for a stale connection)."""
    if request.transport is not None:
        sock = request.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.transport.abort()


async def read_body(request: Request) -> bytes:
    """The whole body (no size cap, as uvicorn), after the interim 100 if the client asked for one."""
    if request.headers.get("Expect", "").lower() == "100-continue":  # what aiohttp's router would answer
        await request.writer.write(CONTINUE)
    return await request.content.read()


async def read_json(request: Request) -> Any:
    """The request body as JSON, or the 400s FastAPI would give."""
    if request.content_type != "application/json":
        raise sglang.bad_request(MEDIA_TYPE_ERROR, "Bad Request")
    try:
        return orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as exc:
        raise sglang.bad_request(f"JSON decode error: {exc}", "Bad Request") from exc


async def hang() -> web.Response:
    """Never answer; the handler is cancelled when the client (or the server) hangs up."""
    await asyncio.sleep(HANG_SECONDS)
    return empty_response(504)
