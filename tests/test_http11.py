"""Our HTTP/1.1 transport on the wire: keep-alive reuse, framing, and every way a server can fail it,
against raw asyncio servers that answer with exact bytes (the framing is what is under test)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gen_pipeline import http11
from gen_pipeline.errors import ConnectError, ConnectionLostError, RequestTimeout
from gen_pipeline.http11 import Http11Transport

OK = b'{"ok": true}'


def answer(body: bytes = OK, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(),
        len(body),
        extra,
        body,
    )


class RawServer:
    """Counts connections, keeps each request's head and body, and lets `reply` write the answer."""

    def __init__(self, reply: Callable[[int, asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.closed_by_client = 0

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
            self.closed_by_client += 1
        finally:
            writer.close()


def serve(reply, check, *, prefix: str = "") -> RawServer:
    """Run `check(transport, url)` against a RawServer answering with `reply`."""
    server = RawServer(reply)

    async def main():
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with Http11Transport("k") as transport:
                await check(transport, f"http://127.0.0.1:{port}{prefix}")
            await asyncio.sleep(0.05)  # the server sees the closes
        finally:
            srv.close()

    asyncio.run(asyncio.wait_for(main(), 20))
    return server


async def always_ok(n, writer):
    writer.write(answer())


async def never_answers(n, writer):
    await asyncio.sleep(3)


def test_sequential_requests_share_one_keepalive_connection():
    """Twenty requests one after another use one socket; the head carries host, agent, key and length."""

    async def check(t, url):
        for i in range(20):
            status, body, headers = await t.request("POST", url, "/v1/chat/completions", 5, b'{"i": %d}' % i)
            assert (status, body, headers["content-type"]) == (200, OK, "application/json")

    server = serve(always_ok, check, prefix="/base/")
    assert server.connections == 1 and len(server.requests) == 20
    head, body = server.requests[3]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /base/v1/chat/completions HTTP/1.1"
    assert "Authorization: Bearer k" in lines and "Content-Type: application/json" in lines
    assert "Content-Length: 8" in lines and any(x.startswith("Host: 127.0.0.1:") for x in lines)
    assert any(x.startswith("User-Agent: gen-pipeline/") for x in lines)
    assert body == b'{"i": 3}'


def test_concurrent_requests_open_one_connection_each_then_reuse_them():
    """Eight at once need eight sockets; the next eight reuse them."""

    async def slow_ok(n, writer):
        await asyncio.sleep(0.05)
        writer.write(answer())

    async def check(t, url):
        for _ in range(2):
            results = await asyncio.gather(*(t.request("GET", url, "/x", 5) for _ in range(8)))
            assert [r[0] for r in results] == [200] * 8

    server = serve(slow_ok, check)
    assert server.connections == 8 and len(server.requests) == 16


def test_get_sends_no_body_headers():
    async def check(t, url):
        await t.request("GET", url, "/health", 5)

    server = serve(always_ok, check)
    head, body = server.requests[0]
    assert head.startswith(b"GET /health HTTP/1.1\r\n") and b"Content-Length" not in head and body == b""


def test_connection_close_answer_is_not_reused():
    """`Connection: close` (or HTTP/1.0) ends the socket; the next request opens a new one."""

    async def close_each(n, writer):
        writer.write(answer(extra=b"Connection: close\r\n"))
        await writer.drain()
        writer.close()

    async def check(t, url):
        for _ in range(3):
            assert (await t.request("GET", url, "/x", 5))[0] == 200

    assert serve(close_each, check).connections == 3


def test_chunked_body_is_joined():
    async def chunked(n, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b'{"a": ', b"1", b"}"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")

    async def check(t, url):
        for _ in range(2):
            assert (await t.request("GET", url, "/x", 5))[:2] == (200, b'{"a": 1}')

    assert serve(chunked, check).connections == 1


def test_body_delimited_by_close_is_delivered():
    """An answer with no length that ends when the server closes (HTTP/1.0 style) is complete."""

    async def eof_body(n, writer):
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + OK)
        await writer.drain()
        writer.close()

    async def check(t, url):
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)

    assert serve(eof_body, check).connections == 2


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_answer_is_decoded(coding):
    """We send `Accept-Encoding: identity`, but a proxy may compress anyway."""
    import gzip
    import zlib

    packed = gzip.compress(OK) if coding == "gzip" else zlib.compress(OK)

    async def compressed(n, writer):
        writer.write(answer(packed, extra=b"Content-Encoding: %s\r\n" % coding.encode()))

    async def check(t, url):
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)

    head, _ = serve(compressed, check).requests[0]
    assert b"Accept-Encoding: identity\r\n" in head


def test_interim_100_continue_is_skipped():
    async def interim(n, writer):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer())

    async def check(t, url):
        assert (await t.request("POST", url, "/x", 5, b"{}"))[:2] == (200, OK)

    serve(interim, check)


def test_error_status_keeps_headers_and_body():
    async def overloaded(n, writer):
        writer.write(answer(b'{"error": "queue full"}', "503 Service Unavailable", b"Retry-After: 2\r\n"))

    async def check(t, url):
        status, body, headers = await t.request("POST", url, "/x", 5, b"{}")
        assert (status, body, headers["retry-after"]) == (503, b'{"error": "queue full"}', "2")

    serve(overloaded, check)


def test_server_closing_an_idle_socket_costs_no_request():
    """A keep-alive socket the server closed while idle is dropped, not used for the next request."""

    async def answer_then_close(n, writer):
        writer.write(answer())
        await writer.drain()
        writer.close()  # no Connection: close header: the client only learns of it from the socket

    async def check(t, url):
        for _ in range(3):
            assert (await t.request("GET", url, "/x", 5))[0] == 200
            await asyncio.sleep(0.05)

    assert serve(answer_then_close, check).connections == 3


def test_socket_idle_past_keepalive_timeout_is_not_reused(monkeypatch):
    monkeypatch.setattr(http11, "KEEPALIVE_TIMEOUT", 0.05)

    async def check(t, url):
        await t.request("GET", url, "/x", 5)
        await t.request("GET", url, "/x", 5)  # at once: reused
        await asyncio.sleep(0.1)
        await t.request("GET", url, "/x", 5)  # idle too long: a new socket

    assert serve(always_ok, check).connections == 2


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
        # an upgrade we never asked for (httptools raises HttpParserUpgrade, not an HttpParserError)
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nxx",
        answer(b"not gzip", extra=b"Content-Encoding: gzip\r\n"),  # a body that does not decode
    ],
    ids=["garbage", "protocol-switch", "corrupt-gzip"],
)
def test_malformed_answer_is_connection_lost(raw):
    async def reply(n, writer):
        writer.write(raw)

    async def check(t, url):
        with pytest.raises(ConnectionLostError, match="malformed HTTP response"):
            await t.request("GET", url, "/x", 5)

    serve(reply, check)


def test_unasked_bytes_after_an_answer_retire_the_socket():
    async def extra(n, writer):
        writer.write(answer() + b"HTTP/1.1 200 OK\r\n")

    async def check(t, url):
        assert (await t.request("GET", url, "/x", 5))[0] == 200
        await asyncio.sleep(0.05)
        assert (await t.request("GET", url, "/x", 5))[0] == 200

    assert serve(extra, check).connections == 2


def test_timeout_closes_the_socket_and_the_next_request_gets_a_fresh_one():
    """A late answer can never be read as the answer to the next request."""

    async def first_hangs(n, writer):
        if n == 1:
            await asyncio.sleep(0.5)
            writer.write(answer(b'{"late": 1}'))
        else:
            writer.write(answer())

    async def check(t, url):
        with pytest.raises(RequestTimeout) as caught:
            await t.request("GET", url, "/x", 0.2)
        assert caught.value.server == url
        assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)

    server = serve(first_hangs, check)
    assert server.connections == 2


def test_a_later_request_with_an_earlier_deadline_times_out_on_time():
    """The shared timer is set again for a deadline earlier than the one it waits for."""

    async def check(t, url):
        slow = asyncio.ensure_future(t.request("GET", url, "/x", 2.0))
        await asyncio.sleep(0.05)
        began = asyncio.get_running_loop().time()
        with pytest.raises(RequestTimeout):
            await t.request("GET", url, "/x", 0.2)
        waited = asyncio.get_running_loop().time() - began
        assert 0.2 <= waited <= 0.2 + http11.Deadlines.SLACK + 0.2
        assert not slow.done()  # its own deadline is still ahead
        with pytest.raises(RequestTimeout):
            await slow
        assert asyncio.get_running_loop().time() - began <= 2.0 + http11.Deadlines.SLACK + 0.2

    serve(never_answers, check)


def test_many_timeouts_each_fire_and_successes_are_left_alone():
    """Requests with staggered deadlines time out one after another; answered ones are never cancelled."""

    async def odd_ones_hang(n, writer):
        if n % 2:
            await asyncio.sleep(3)
        else:
            writer.write(answer())

    async def one(t, url, timeout):
        try:
            return (await t.request("GET", url, "/x", timeout))[0]
        except RequestTimeout:
            return "timeout"

    async def check(t, url):
        results = await asyncio.gather(*(one(t, url, 0.1 + i / 20) for i in range(10)))
        assert results.count("timeout") == 5 and results.count(200) == 5

    serve(odd_ones_hang, check)


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


def test_refused_and_unresolvable_are_connect_errors():
    async def main():
        async with Http11Transport() as t:
            with pytest.raises(ConnectError, match="cannot connect") as caught:
                await t.request("GET", "http://127.0.0.1:1", "/x", 5)
            assert caught.value.server == "http://127.0.0.1:1"
            with pytest.raises(ConnectError):
                await t.request("GET", "http://no-such-host.invalid:30000", "/x", 5)
            with pytest.raises(ConnectError, match="not an http"):
                await t.request("GET", "ftp://127.0.0.1:1", "/x", 5)

    asyncio.run(main())


def test_close_shuts_every_socket():
    async def slow_ok(n, writer):
        await asyncio.sleep(0.02)
        writer.write(answer())

    async def check(t, url):
        await asyncio.gather(*(t.request("GET", url, "/x", 5) for _ in range(4)))

    server = serve(slow_ok, check)
    assert server.connections == 4 and server.closed_by_client == 4


def test_ipv6_literal_url():
    async def main():
        server = RawServer(always_ok)
        srv = await asyncio.start_server(server.handle, "::1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with Http11Transport() as t:
                assert (await t.request("GET", f"http://[::1]:{port}", "/x", 5))[0] == 200
        finally:
            srv.close()
        return server

    try:
        server = asyncio.run(main())
    except OSError as exc:  # no IPv6 loopback on this machine
        pytest.skip(f"no IPv6 loopback: {exc}")
    assert b"Host: [::1]:" in server.requests[0][0]


@pytest.fixture
def self_signed(tmp_path):
    """A certificate for 127.0.0.1 made with the openssl command."""
    import shutil
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_https_verifies_the_server_certificate(self_signed, monkeypatch):
    """https:// URLs get TLS with verification: a trusted certificate works, an unknown one cannot connect."""
    import ssl

    cert, key = self_signed
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def main():
        server = RawServer(always_ok)
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
        url = f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            async with Http11Transport() as t:
                with pytest.raises(ConnectError, match="cannot connect: SSLCertVerificationError"):
                    await t.request("GET", url, "/x", 5)
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read when the transport makes its context
            async with Http11Transport() as t:
                assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)
                assert (await t.request("GET", url, "/x", 5))[:2] == (200, OK)
        finally:
            srv.close()
        return server

    server = asyncio.run(asyncio.wait_for(main(), 20))
    assert len(server.requests) == 2 and server.connections == 1  # the failed handshake never reached it
