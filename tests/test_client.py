"""The HTTP layer: statuses and aiohttp errors map to our error tree, once."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gen_pipeline.errors import (
    AuthError,
    BadRequestError,
    ConnectError,
    ConnectionLostError,
    OverloadedError,
    RequestError,
    RequestTimeout,
    ServerError,
)
from gen_pipeline.http.client import HTTP_CLIENTS, Client, open_transport, parse_chat, status_error
from gen_pipeline.http.transport import map_errors


@pytest.mark.parametrize(
    ("status", "cls", "reason"),
    [
        (400, BadRequestError, "bad_request"),
        (401, AuthError, "bad_request"),
        (403, AuthError, "bad_request"),
        (404, BadRequestError, "bad_request"),
        (408, RequestTimeout, "timeout"),
        (429, OverloadedError, "server_error"),
        (500, ServerError, "server_error"),
        (502, ServerError, "server_error"),
        (503, OverloadedError, "server_error"),
        (504, ServerError, "server_error"),
    ],
)
def test_status_table(status, cls, reason):
    """Each status code maps to exactly one error class and ledger reason."""
    err = status_error(status, {"message": "x"}, "http://s")
    assert type(err) is cls
    assert err.reason == reason and err.status == status and err.server == "http://s"


def test_retry_after_is_read():
    """A 429's Retry-After header reaches the error."""
    err = status_error(429, None, "s", {"retry-after": "3"})  # transports give lower-case names
    assert isinstance(err, OverloadedError) and err.retry_after == 3.0


def _conn_key():
    from aiohttp.client_reqrep import ConnectionKey

    return ConnectionKey("h", 1, False, True, None, None, None)


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (aiohttp.ClientConnectorError(_conn_key(), OSError(111, "refused")), ConnectError),
        (aiohttp.ServerDisconnectedError(), ConnectionLostError),
        (aiohttp.ClientPayloadError("cut"), ConnectionLostError),
        (aiohttp.ClientOSError(104, "reset"), ConnectionLostError),
        (aiohttp.ServerTimeoutError("slow"), RequestTimeout),
        (TimeoutError(), RequestTimeout),
        (ConnectionResetError(), ConnectionLostError),
        (aiohttp.ClientResponseError(None, (), status=500), ConnectionLostError),  # type: ignore[arg-type]
    ],
)
def test_foreign_errors_map(exc, cls):
    """Every aiohttp and socket error we can meet becomes one of ours, chained."""
    with pytest.raises(cls) as info, map_errors("http://s"):
        raise exc
    assert info.value.__cause__ is exc


def test_every_aiohttp_client_error_is_mapped():
    """Meta-test: every public aiohttp.ClientError subclass maps to a RequestError."""
    classes = {
        obj
        for name in dir(aiohttp)
        if isinstance(obj := getattr(aiohttp, name), type) and issubclass(obj, aiohttp.ClientError)
    }
    assert len(classes) > 10
    for cls in classes:
        exc = cls.__new__(cls)  # construction signatures differ; mapping looks only at the type
        with pytest.raises(RequestError), map_errors("s"):
            raise exc


def test_malformed_200_is_a_server_error():
    """A 200 without choices is a retryable server error, not a crash."""
    with pytest.raises(ServerError):
        parse_chat({"object": "error"}, "s")
    ok = parse_chat(
        {
            "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        },
        "s",
    )
    assert ok.content == "hi" and ok.prompt_tokens == 3 and ok.reasoning_content is None
    thought = parse_chat({"choices": [{"message": {"content": "4", "reasoning_content": "2+2"}}]}, "s")
    assert (thought.content, thought.reasoning_content) == ("4", "2+2")


@pytest.mark.parametrize(
    ("message", "finish", "usage"),
    [
        ({"content": ["x"]}, "stop", {}),  # would reach the dataset as a list
        ({"content": "x"}, 3, {}),
        ({"content": "x"}, "stop", {"completion_tokens": "8"}),  # crashed the run's token totals
        ({"content": "x"}, "stop", {"prompt_tokens": 5.5}),
        ({"content": "x"}, "stop", {"prompt_tokens": True}),
        ({"content": "x", "reasoning_content": {"text": "?"}}, "stop", {}),
    ],
)
def test_a_200_with_a_field_of_the_wrong_type_is_a_server_error(message, finish, usage):
    """Only a string completion and integer counts (or none) pass; anything else is retried elsewhere and
    ledgered, never written to the output or added to the totals."""
    with pytest.raises(ServerError, match="malformed completion"):
        parse_chat({"choices": [{"message": message, "finish_reason": finish}], "usage": usage}, "s")


async def _with_server(handler, check, kind):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server, open_transport("k", kind) as transport:
        return await check(Client(transport), str(server.make_url("")).rstrip("/"))


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_chat_over_real_socket_sends_bearer_and_json(kind):
    """A chat request carries the key and JSON body; a 200 becomes a ChatResult."""
    seen = {}

    async def handler(request):
        seen["auth"] = request.headers.get("Authorization")
        seen["ctype"] = request.headers.get("Content-Type")
        seen["body"] = await request.json()
        return web.json_response(
            {
                "choices": [{"message": {"content": "ok"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2},
            }
        )

    async def check(client, url):
        return await client.chat(url, {"messages": [], "max_tokens": 2}, 5)

    result = asyncio.run(asyncio.wait_for(_with_server(handler, check, kind), 10))
    assert result.finish_reason == "length" and result.completion_tokens == 2
    assert seen["auth"] == "Bearer k" and seen["ctype"] == "application/json"
    assert seen["body"]["max_tokens"] == 2


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_timeout_and_refused_over_real_sockets(kind):
    """A hung server times out; a closed port is refused."""

    async def handler(request):
        await asyncio.sleep(10)
        return web.Response()

    async def check(client, url):
        with pytest.raises(RequestTimeout):
            await client.chat(url, {}, 0.2)
        with pytest.raises(ConnectError):
            await client.chat("http://127.0.0.1:1", {}, 2)

    asyncio.run(asyncio.wait_for(_with_server(handler, check, kind), 10))


@pytest.mark.parametrize("kind", HTTP_CLIENTS)
def test_a_full_file_table_is_not_blamed_on_the_server(kind):
    """EMFILE when opening a socket is our limit (ulimit -n): ConnectionLostError, not ConnectError (which
    takes a server out of rotation at once)."""
    import subprocess
    import sys

    code = """
import asyncio, resource, sys
from gen_pipeline.http.client import open_transport
from gen_pipeline.errors import ConnectionLostError

async def main():
    async def hold(reader, writer):
        await asyncio.sleep(5)
    srv = await asyncio.start_server(hold, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    async with open_transport(None, sys.argv[1]) as t:
        results = await asyncio.gather(*(t.request("GET", url, "/x", 2) for _ in range(80)), return_exceptions=True)
    lost = [r for r in results if isinstance(r, ConnectionLostError) and "ulimit -n" in str(r)]
    print(len(lost), sorted({type(r).__name__ for r in results}))
    srv.close()

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code, kind], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    count, kinds = out.stdout.split(" ", 1)
    assert int(count) > 0 and "ConnectError" not in kinds, out.stdout
