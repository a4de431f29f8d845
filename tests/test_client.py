"""The HTTP client: statuses map to our error tree in one table, and 200 bodies are checked."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gen_pipeline.errors import (
    AuthError,
    BadRequestError,
    ConnectError,
    EndpointError,
    FatalRequestError,
    OverloadedError,
    RequestTimeout,
    ServerError,
)
from gen_pipeline.http import Client, open_transport, parse_chat, status_error


@pytest.mark.parametrize(
    ("status", "cls", "reason"),
    [
        (400, BadRequestError, "bad_request"),
        (401, AuthError, "bad_request"),
        (403, AuthError, "bad_request"),
        (405, BadRequestError, "bad_request"),
        (422, BadRequestError, "bad_request"),
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


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308, 404])
def test_a_redirect_or_a_404_is_an_endpoint_error_naming_the_url(status):
    """A 3xx or a 404 says the URL is wrong, not the row: EndpointError (fatal), with the URL and any Location."""
    headers = {"location": "https://login.example/"} if status != 404 else {}
    err = status_error(status, "<html>", "http://s:1", headers, "POST http://s:1/v1/chat/completions")
    assert type(err) is EndpointError and isinstance(err, FatalRequestError)
    assert err.status == status and err.server == "http://s:1" and err.url == "http://s:1/v1/chat/completions"
    assert f"POST http://s:1/v1/chat/completions answered HTTP {status}" in str(err)
    assert ("to https://login.example/" in str(err)) == (status != 404)


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


async def _with_server(handler, check, stream=False):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server, open_transport("k") as transport:
        return await check(Client(transport, stream=stream), str(server.make_url("")).rstrip("/"))


MODES = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@MODES
def test_chat_over_real_socket_sends_bearer_and_json(stream):
    """A chat request carries the key and JSON body; a 200 becomes a ChatResult (a streamed request answered
    whole is read whole)."""
    seen = {}

    async def handler(request):
        seen["agent"] = request.headers.get("User-Agent")
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

    result = asyncio.run(asyncio.wait_for(_with_server(handler, check, stream), 10))
    assert result.finish_reason == "length" and result.completion_tokens == 2
    assert seen["auth"] == "Bearer k" and seen["ctype"] == "application/json"
    assert seen["agent"].startswith("gen-pipeline/")
    assert seen["body"]["max_tokens"] == 2


@MODES
def test_timeout_and_refused_over_real_sockets(stream):
    """A hung server times out; a closed port is refused."""

    async def handler(request):
        await asyncio.sleep(10)
        return web.Response()

    async def check(client, url):
        with pytest.raises(RequestTimeout):
            await client.chat(url, {}, 0.2)
        with pytest.raises(ConnectError):
            await client.chat("http://127.0.0.1:1", {}, 2)

    asyncio.run(asyncio.wait_for(_with_server(handler, check, stream), 10))


@MODES
def test_a_redirect_is_not_followed(stream):
    """A 302 is returned as an EndpointError: the request is never re-sent to where it points."""
    hits = []

    async def handler(request):
        hits.append(request.path)
        if request.path == "/v1/chat/completions":
            raise web.HTTPFound("/elsewhere")
        return web.json_response({"choices": [{"message": {"content": "followed"}}]})

    async def check(client, url):
        with pytest.raises(EndpointError, match="answered HTTP 302 to /elsewhere") as caught:
            await client.chat(url, {}, 5)
        assert caught.value.url == url + "/v1/chat/completions"

    asyncio.run(asyncio.wait_for(_with_server(handler, check, stream), 10))
    assert hits == ["/v1/chat/completions"]


def test_a_full_file_table_is_not_blamed_on_the_server():
    """EMFILE when opening a socket is our limit (ulimit -n): ConnectionLostError, not ConnectError (which
    takes a server out of rotation at once)."""
    import subprocess
    import sys

    code = """
import asyncio, resource, sys
from gen_pipeline.http import open_transport
from gen_pipeline.errors import ConnectionLostError

async def main():
    async def hold(reader, writer):
        await asyncio.sleep(5)
    srv = await asyncio.start_server(hold, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    async with open_transport(None) as t:
        results = await asyncio.gather(*(t.request("GET", url, "/x", 2) for _ in range(80)), return_exceptions=True)
    lost = [r for r in results if isinstance(r, ConnectionLostError) and "ulimit -n" in str(r)]
    print(len(lost), sorted({type(r).__name__ for r in results}))
    srv.close()

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    count, kinds = out.stdout.split(" ", 1)
    assert int(count) > 0 and "ConnectError" not in kinds, out.stdout
