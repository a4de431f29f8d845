"""The simulator's HTTP/1.1 server (gen_pipeline/sim/http.py) on raw 127.0.0.1 sockets: what uvicorn does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson

from gen_pipeline.sim import SimConfig, free_ports, start_fleet
from gen_pipeline.sim.http import HttpServer, Reply, Request

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def run(coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode() + body


def get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *headers]) + "\r\n\r\n").encode()


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, lower-case headers, body (by Content-Length)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = dict((k.lower(), v.strip()) for k, v in (line.split(":", 1) for line in head[1:] if line))
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


@contextlib.asynccontextmanager
async def fleet_socket() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """One simulated port and one raw connection to it."""
    cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)
    async with await start_fleet(cfg):
        reader, writer = await asyncio.open_connection("127.0.0.1", cfg.ports[0])
        try:
            yield reader, writer
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def own_server(handler: Any, keepalive_timeout: float = 5.0) -> AsyncIterator[int]:
    """An HttpServer serving `handler` on a free port; yields the port."""
    server = HttpServer(handler, keepalive_timeout)
    port = free_ports(1)[0]
    await server.listen("127.0.0.1", port)
    try:
        yield port
    finally:
        await server.close()


def test_unknown_path_and_wrong_method_get_fastapis_json() -> None:
    """404 {"detail":"Not Found"} and 405 {"detail":"Method Not Allowed"}, on a connection kept alive."""

    async def scenario() -> list[tuple[int, bytes]]:
        async with fleet_socket() as (reader, writer):
            out = []
            for raw in (get("/nope"), get("/v1/chat/completions"), post("/health", b"{}"), get("/health")):
                writer.write(raw)
                status, _, body = await read_reply(reader)
                out.append((status, body))
            return out

    assert run(scenario()) == [
        (404, b'{"detail":"Not Found"}'),
        (405, b'{"detail":"Method Not Allowed"}'),
        (405, b'{"detail":"Method Not Allowed"}'),
        (200, b""),
    ]


def test_pipelined_requests_are_answered_in_order() -> None:
    """Three requests in one write get three replies, in the order sent."""

    async def scenario() -> list[int]:
        async with fleet_socket() as (reader, writer):
            writer.write(post("/v1/chat/completions", CHAT) + get("/nope") + get("/v1/models/other"))
            return [(await read_reply(reader))[0] for _ in range(3)]

    assert run(scenario()) == [200, 404, 404]


def test_malformed_request_gets_400_and_close() -> None:
    """A request llhttp cannot parse gets uvicorn's 400 text, then the connection is closed."""

    async def scenario() -> tuple[int, bytes, bytes]:
        async with fleet_socket() as (reader, writer):
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            status, headers, body = await read_reply(reader)
            assert headers["connection"] == "close"
            return status, body, await reader.read()

    assert run(scenario()) == (400, b"Invalid HTTP request received.", b"")


def test_connection_close_and_expect_continue() -> None:
    """`Connection: close` closes after the reply; `Expect: 100-continue` gets its interim 100 first."""

    async def scenario() -> tuple[bytes, int, bytes]:
        async with fleet_socket() as (reader, writer):
            head, body = post("/v1/chat/completions", CHAT, "Expect: 100-continue").split(b"\r\n\r\n", 1)
            writer.write(head + b"\r\n\r\n")
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(body)
            status, _, _ = await read_reply(reader)
            writer.write(get("/health", "Connection: close"))
            await read_reply(reader)
            return interim, status, await reader.read()

    assert run(scenario()) == (b"HTTP/1.1 100 Continue\r\n\r\n", 200, b"")


def test_idle_keepalive_connection_is_closed_after_the_timeout() -> None:
    """An idle connection is closed (FIN, not reset) after keepalive_timeout; a busy one is not."""

    async def slow(request: Request) -> Reply:
        await asyncio.sleep(0.3)
        return Reply(200, b"{}")

    async def scenario() -> tuple[int, bytes]:
        async with own_server(slow, keepalive_timeout=0.1) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(get("/"))
            status, _, _ = await read_reply(reader)  # took 0.3 s, longer than the timeout: not closed meanwhile
            closed = await asyncio.wait_for(reader.read(), 2.0)
            writer.close()
            return status, closed

    assert run(scenario()) == (200, b"")


def test_handler_is_cancelled_when_the_client_goes_away() -> None:
    """SGLang aborts the request of a client that hung up: the handler sees CancelledError."""

    cancelled = asyncio.Event()

    async def forever(request: Request) -> Reply:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Reply()

    async def scenario() -> None:
        async with own_server(forever) as port:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(get("/"))
            await asyncio.sleep(0.05)
            writer.close()
            await asyncio.wait_for(cancelled.wait(), 2.0)

    run(scenario())


def test_a_handler_bug_is_a_500_and_the_connection_lives_on(capsys: Any) -> None:
    """An exception in a handler is printed and answered 500; the next request on the connection is served."""

    async def buggy(request: Request) -> Reply:
        if request.path == "/bug":
            raise KeyError("boom")
        return Reply(200, b"ok", "text/plain")

    async def scenario() -> list[tuple[int, bytes]]:
        async with own_server(buggy) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            out = []
            for path in ("/bug", "/fine"):
                writer.write(get(path))
                status, _, body = await read_reply(reader)
                out.append((status, body))
            writer.close()
            return out

    assert run(scenario()) == [(500, b"Internal Server Error"), (200, b"ok")]
    assert "KeyError: 'boom'" in capsys.readouterr().err
