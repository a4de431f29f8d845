"""The aiohttp transport on the wire: keep-alive reuse, deadlines, the body cap, and the answers it must not
trust, against raw asyncio servers that answer with exact bytes."""

from __future__ import annotations

import asyncio
import errno
import gzip
import socket
import struct

import aiohttp
import pytest
from rawserver import OK, always_ok, answer, never_answers, serve

from gen_pipeline.config import MAX_RESPONSE_BYTES
from gen_pipeline.errors import ConnectionLostError, RequestTimeout, ResponseTooLargeError
from gen_pipeline.http import AiohttpTransport
from gen_pipeline.http.transport import unserved


def test_sequential_requests_share_one_keepalive_connection():
    """Twenty requests one after another use one socket; the head carries host, agent, key and JSON type."""

    async def check(t, url):
        for i in range(20):
            status, body, headers = await t.request("POST", url, "/v1/chat/completions", 5, b'{"i": %d}' % i)
            assert (status, body, headers["content-type"]) == (200, OK, "application/json")

    server = serve(always_ok, check)
    assert server.connections == 1 and len(server.requests) == 20
    head, body = server.requests[3]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert "Authorization: Bearer k" in lines and "Content-Type: application/json" in lines
    assert any(x.startswith("Host: 127.0.0.1:") for x in lines)
    assert any(x.startswith("User-Agent: gen-pipeline/") for x in lines)
    assert body == b'{"i": 3}'


def test_concurrent_requests_open_one_connection_each_then_reuse_them():
    """Eight at once need eight sockets; the next eight reuse them."""
    arrived: list[asyncio.Event] = []

    async def wait_for_all_eight(n, writer):
        if n <= 8:  # the first eight are answered once all eight are in: they overlap for sure
            arrived.append(asyncio.Event())
            if len(arrived) == 8:
                for event in arrived:
                    event.set()
            await arrived[n - 1].wait()
        writer.write(answer())

    async def check(t, url):
        for _ in range(2):
            results = await asyncio.gather(*(t.request("GET", url, "/x", 5) for _ in range(8)))
            assert [r[0] for r in results] == [200] * 8

    server = serve(wait_for_all_eight, check)
    assert server.connections == 8 and len(server.requests) == 16


def test_connection_close_answer_is_not_reused():
    """`Connection: close` ends the socket; the next request opens a new one."""

    async def close_each(n, writer):
        writer.write(answer(extra=b"Connection: close\r\n"))
        await writer.drain()
        writer.close()

    async def check(t, url):
        for _ in range(3):
            assert (await t.request("GET", url, "/x", 5))[0] == 200

    assert serve(close_each, check).connections == 3


def test_chunked_and_compressed_bodies_are_decoded():
    """A chunked body is joined, and a gzip one (a proxy may compress) is decoded."""

    async def chunked_then_gzip(n, writer):
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b'{"ok": ', b"true", b"}"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(answer(gzip.compress(OK), extra=b"Content-Encoding: gzip\r\n"))

    async def check(t, url):
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)

    assert serve(chunked_then_gzip, check).connections == 1


def test_error_status_keeps_headers_and_body():
    """A 503's body and Retry-After reach the client (header names are case-insensitive)."""

    async def overloaded(n, writer):
        writer.write(answer(b'{"error": "queue full"}', "503 Service Unavailable", b"Retry-After: 2\r\n"))

    async def check(t, url):
        status, body, headers = await t.request("POST", url, "/x", 5, b"{}")
        assert (status, body) == (503, b'{"error": "queue full"}')
        assert headers["retry-after"] == headers["Retry-After"] == "2"

    serve(overloaded, check)


def test_timeout_closes_the_socket_and_the_next_request_gets_a_fresh_one():
    """A late answer can never be read as the answer to the next request."""
    release = asyncio.Event()

    async def first_hangs(n, writer):
        if n == 1:
            await release.wait()
            writer.write(answer(b'{"late": 1}'))
        else:
            writer.write(answer())

    async def check(t, url):
        with pytest.raises(RequestTimeout) as caught:
            await t.request("GET", url, "/x", 0.2)
        assert caught.value.server == url
        release.set()
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)

    assert serve(first_hangs, check).connections == 2


def test_many_timeouts_each_fire_and_successes_are_left_alone():
    """Requests with staggered deadlines time out one by one; answered ones are never cancelled."""

    async def odd_ones_hang(n, writer):
        if n % 2:
            await asyncio.sleep(30)
        else:
            writer.write(answer())

    async def one(t, url, timeout):
        try:
            return (await t.request("GET", url, "/x", timeout))[0]
        except RequestTimeout:
            return "timeout"

    async def check(t, url):
        results = await asyncio.gather(*(one(t, url, 0.1 + i / 50) for i in range(10)))
        assert results.count("timeout") == 5 and results.count(200) == 5

    serve(odd_ones_hang, check)


def test_a_later_request_with_an_earlier_deadline_times_out_first():
    """The shared timer is set again for a deadline earlier than the one it waits for."""

    async def check(t, url):
        slow = asyncio.ensure_future(t.request("GET", url, "/x", 60))
        await asyncio.sleep(0.05)
        with pytest.raises(RequestTimeout):
            await t.request("GET", url, "/x", 0.2)
        assert not slow.done()  # its own deadline is still ahead
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow

    serve(never_answers, check)


def test_a_cancellation_at_the_deadline_is_not_taken_for_a_timeout():
    """The task cancelled by someone else as its deadline passes is cancelled, not timed out."""

    async def check(t, url):
        task = asyncio.ensure_future(t.request("GET", url, "/x", 5))
        await asyncio.sleep(0.1)
        deadlines = t._deadlines
        deadlines._due[task] = 0.0  # the deadline passes now, in this very step...
        deadlines._fire(asyncio.get_running_loop())
        task.cancel()  # ...and the run is being stopped
        with pytest.raises(asyncio.CancelledError):
            await task

    serve(never_answers, check)


def test_a_cancelled_request_stays_cancelled():
    """Cancelling a request (a run's grace period ending) is not mapped to a timeout or any error of ours."""

    async def check(t, url):
        task = asyncio.ensure_future(t.request("GET", url, "/x", 5))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    serve(never_answers, check)


def test_the_body_cap_defaults_to_64_mib():
    assert MAX_RESPONSE_BYTES == 64 * 2**20
    assert AiohttpTransport.__init__.__defaults__ == (None, MAX_RESPONSE_BYTES, None)


CAP = 1000


async def declared_huge(n, writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n" + b"x" * 10)
    await asyncio.sleep(30)  # a client waiting for the rest would time out instead


async def endless(n, writer):
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while not writer.is_closing():  # a client reading to the end would time out instead
        writer.write(b"64\r\n%s\r\n" % (b"x" * 100))
        await writer.drain()


async def one_over_then_at_the_cap(n, writer):
    writer.write(answer(b"x" * (CAP + 1 if n == 1 else CAP)))


@pytest.mark.parametrize("reply", [declared_huge, endless, one_over_then_at_the_cap])
def test_a_body_over_the_cap_is_an_error_and_is_not_read_further(reply):
    """Over the cap, announced or streamed: ResponseTooLargeError (a server error: retried elsewhere, then
    ledgered as server_error) as soon as the cap is passed, within the request's 5 s; at the cap: read whole."""

    async def check(t, url):
        with pytest.raises(ResponseTooLargeError, match="over 1,000 bytes from GET http") as caught:
            await t.request("GET", url, "/x", 5)
        assert caught.value.reason == "server_error" and caught.value.server == url
        if reply is one_over_then_at_the_cap:
            assert (await t.request("GET", url, "/x", 5))[1] == b"x" * CAP

    serve(reply, check, max_body=CAP)


def test_cut_mid_answer_is_connection_lost_and_the_next_request_works():
    async def cut_first(n, writer):
        if n == 1:
            writer.write(answer()[:-4])
            await writer.drain()
            writer.close()
        else:
            writer.write(answer())

    async def check(t, url):
        with pytest.raises(ConnectionLostError) as caught:
            await t.request("POST", url, "/x", 5, b"{}")
        assert caught.value.server == url
        assert (await t.request("POST", url, "/x", 5, b"{}"))[0] == 200

    assert serve(cut_first, check).connections == 2


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
        answer(b"not gzip", extra=b"Content-Encoding: gzip\r\n"),  # a body that does not decode
    ],
    ids=["garbage", "corrupt-gzip"],
)
def test_malformed_answer_is_connection_lost(raw):
    async def reply(n, writer):
        writer.write(raw)

    async def check(t, url):
        with pytest.raises(ConnectionLostError):
            await t.request("GET", url, "/x", 5)

    serve(reply, check)


def test_a_pooled_connection_the_server_closed_unanswered_is_replaced_and_the_request_sent_again():
    """A server that closes a kept-alive connection when the next request comes (llama.cpp does after two
    streamed answers) never served that request: it goes out again on a fresh connection, with no error."""

    async def close_every_third(n, writer):
        if n % 3 == 0:
            writer.close()  # a clean close, no answer
        else:
            writer.write(answer())

    async def check(t, url):
        for i in range(6):
            assert (await t.request("POST", url, "/x", 5, b'{"i": %d}' % i))[:2] == (200, OK)

    server = serve(close_every_third, check)
    assert len(server.requests) == 8 and server.connections == 3


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-connection", "pooled-reset"])
def test_a_request_the_server_may_have_read_is_not_sent_again(fresh):
    """A new connection closed unanswered, or a pooled one reset (a TCP RST after the server read the request):
    the failure is the server's, raised once (the retry policy decides), never resent by the transport."""

    async def fail(n, writer):
        if n == 1 and not fresh:
            writer.write(answer())
        elif fresh:
            writer.close()
        else:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def check(t, url):
        if not fresh:
            assert (await t.request("POST", url, "/x", 5, b"{}"))[0] == 200
        with pytest.raises(ConnectionLostError):
            await t.request("POST", url, "/x", 5, b"{}")

    server = serve(fail, check)
    assert len(server.requests) == (1 if fresh else 2)


@pytest.mark.parametrize(
    ("exc", "unserved_"),
    [
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientOSError(None, "Can not write request body for http://s/x"), True),
        (aiohttp.ClientOSError(errno.EPIPE, "Broken pipe"), True),
        (aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"), False),
        (aiohttp.ClientConnectorError(None, OSError(None, "refused")), False),  # type: ignore[arg-type]
    ],
    ids=["clean-close", "unwritten", "broken-pipe", "reset", "connector"],
)
def test_only_a_request_the_server_never_took_counts_as_unserved(exc, unserved_):
    """What a pooled connection's failure says of its request: a clean close before the answer, or a body that
    could not be written, was never served; a reset may come after the server read it."""
    assert unserved(exc) is unserved_
