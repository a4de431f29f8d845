"""The simulator's HTTP face on raw 127.0.0.1 sockets: what it adds to aiohttp's server to answer as SGLang's
FastAPI app on uvicorn does (JSON 404/405, `server: uvicorn`, bare empty replies, 100-continue, large bodies)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson

from gen_pipeline.sim import SimConfig, free_ports, start_fleet

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


def test_unknown_path_and_wrong_method_get_fastapis_json() -> None:
    """404 {"detail":"Not Found"} and 405 {"detail":"Method Not Allowed"}, on one connection kept alive."""

    async def scenario() -> list[tuple[int, str, bytes]]:
        async with fleet_socket() as (reader, writer):
            out = []
            for raw in (get("/nope"), get("/v1/chat/completions"), post("/health", b"{}"), post("/v1/models/m", b"")):
                writer.write(raw)
                status, headers, body = await read_reply(reader)
                out.append((status, headers["content-type"], body))
            return out

    not_found, not_allowed = b'{"detail":"Not Found"}', b'{"detail":"Method Not Allowed"}'
    assert run(scenario()) == [
        (404, "application/json", not_found),
        (405, "application/json", not_allowed),
        (405, "application/json", not_allowed),
        (405, "application/json", not_allowed),
    ]


def test_replies_say_uvicorn_and_empty_ones_have_no_content_type() -> None:
    """Every reply names uvicorn as its server; /health and /ready are bare (Starlette's Response())."""

    async def scenario() -> list[tuple[int, dict[str, str]]]:
        async with fleet_socket() as (reader, writer):
            out = []
            for raw in (get("/health"), get("/ready"), get("/v1/models"), post("/v1/chat/completions", CHAT)):
                writer.write(raw)
                status, headers, _ = await read_reply(reader)
                out.append((status, headers))
            return out

    replies = run(scenario())
    assert [status for status, _ in replies] == [200, 200, 200, 200]
    assert all(headers["server"] == "uvicorn" for _, headers in replies)
    json = "application/json"
    assert [headers.get("content-type") for _, headers in replies] == [None, None, json, json]
    assert all(headers["content-length"] == "0" for _, headers in replies[:2])


def test_expect_continue_gets_its_interim_100() -> None:
    """A client that sends `Expect: 100-continue` gets the interim 100 before it sends the body."""

    async def scenario() -> tuple[bytes, int]:
        async with fleet_socket() as (reader, writer):
            head, body = post("/v1/chat/completions", CHAT, "Expect: 100-continue").split(b"\r\n\r\n", 1)
            writer.write(head + b"\r\n\r\n")
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(body)
            status, _, _ = await read_reply(reader)
            return interim, status

    assert run(scenario()) == (b"HTTP/1.1 100 Continue\r\n\r\n", 200)


def test_a_body_over_a_mebibyte_is_read() -> None:
    """A 2 MiB body is read and parsed (aiohttp's request.read() would refuse it with a 413)."""
    big = orjson.dumps({"messages": [], "padding": "x" * (2 << 20)})

    async def scenario() -> tuple[int, str]:
        async with fleet_socket() as (reader, writer):
            writer.write(post("/v1/chat/completions", big))
            status, _, body = await read_reply(reader)
            return status, orjson.loads(body)["message"]

    assert run(scenario()) == (400, "Messages cannot be empty.")
