"""Every foreign exception a request can raise becomes one of ours, in one place (transport.map_errors):
a table, a meta-test over all of aiohttp's client errors, and the failures met on real sockets."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import struct

import aiohttp
import aiohttp.client_exceptions
import pytest
from rawserver import always_ok, never_answers, serve

from gen_pipeline.errors import (
    ConnectError,
    ConnectionLostError,
    EndpointError,
    PipelineError,
    RequestError,
    RequestTimeout,
    ServerError,
)
from gen_pipeline.http import AiohttpTransport, map_errors


def _conn_key():
    from aiohttp.client_reqrep import ConnectionKey

    return ConnectionKey("h", 1, False, True, None, None, None)


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (aiohttp.ClientConnectorError(_conn_key(), OSError(errno.ECONNREFUSED, "refused")), ConnectError),
        (aiohttp.ClientConnectorError(_conn_key(), OSError(errno.EMFILE, "too many")), ConnectionLostError),
        (aiohttp.ClientConnectorDNSError(_conn_key(), OSError(-2, "Name or service not known")), ConnectError),
        (aiohttp.ServerDisconnectedError(), ConnectionLostError),
        (aiohttp.ClientPayloadError("cut"), ConnectionLostError),
        (aiohttp.ClientOSError(errno.ECONNRESET, "reset"), ConnectionLostError),
        (aiohttp.ClientConnectionResetError("reset"), ConnectionLostError),
        (aiohttp.ServerTimeoutError("slow"), RequestTimeout),  # an OSError too: timeout comes first
        (aiohttp.ConnectionTimeoutError("slow"), RequestTimeout),
        (TimeoutError(), RequestTimeout),
        (ConnectionResetError(), ConnectionLostError),
        (BrokenPipeError(), ConnectionLostError),
        (OSError(errno.ENETUNREACH, "unreachable"), ConnectionLostError),
        (aiohttp.ClientResponseError(None, (), status=400, message="bad status line"), ConnectionLostError),  # type: ignore[arg-type]
        (aiohttp.InvalidURL("http://:80"), EndpointError),
        (aiohttp.InvalidUrlClientError("http://[::1"), EndpointError),
        (aiohttp.NonHttpUrlClientError("ftp://h"), EndpointError),
        (UnicodeError("encoding with 'idna' codec failed (UnicodeError: label too long)"), EndpointError),
        (ValueError("port out of range"), EndpointError),
    ],
)
def test_foreign_errors_map(exc, cls):
    """Each foreign error becomes the most specific one of ours, chained, with the server on it."""
    with pytest.raises(RequestError) as info, map_errors("http://s", "http://s/x"):
        raise exc
    assert type(info.value) is cls and info.value.__cause__ is exc and info.value.server == "http://s"


def _aiohttp_client_errors() -> set[type[BaseException]]:
    """aiohttp.ClientError and every subclass of it: those aiohttp's namespaces name, and their subclasses."""
    found = {
        obj
        for module in (aiohttp, aiohttp.client_exceptions)
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, aiohttp.ClientError)
    }
    todo = list(found)
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_aiohttp_client_error_is_mapped():
    """Meta-test: every aiohttp.ClientError subclass, found recursively, maps to a RequestError of ours."""
    classes = _aiohttp_client_errors()
    assert len(classes) >= 25 and aiohttp.ClientConnectorDNSError in classes
    unmapped = []
    for cls in sorted(classes, key=lambda c: c.__name__):
        exc = cls.__new__(cls)  # construction signatures differ; mapping looks only at the type
        try:
            with map_errors("s"):
                raise exc
        except RequestError as ours:
            assert ours.__cause__ is exc
        except BaseException:  # the point: whatever escapes the mapping
            unmapped.append(cls.__name__)
    assert not unmapped, unmapped


def test_our_errors_and_cancellation_pass_through_unchanged():
    """An error already ours is not wrapped again; a cancellation is never mistaken for a failure."""
    ours = ServerError("x", server="s")
    with pytest.raises(ServerError) as info, map_errors("s"):
        raise ours
    assert info.value is ours
    with pytest.raises(asyncio.CancelledError), map_errors("s"):
        raise asyncio.CancelledError
    assert issubclass(EndpointError, PipelineError)


def _request(url: str, timeout: float = 5) -> None:
    async def main() -> None:
        async with AiohttpTransport() as t:
            await t.request("GET", url, "/x", timeout)

    asyncio.run(asyncio.wait_for(main(), 20))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_on_a_real_socket_is_a_connect_error():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ConnectError, match="cannot connect") as caught:
        _request(url)
    assert caught.value.server == url


def test_reset_on_a_real_socket_is_connection_lost():
    """A server that resets the socket (RST: SO_LINGER 0) after reading the request."""

    async def reset(n, writer):
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def check(t, url):
        with pytest.raises(ConnectionLostError) as caught:
            await t.request("POST", url, "/x", 5, b"{}")
        assert caught.value.server == url

    serve(reset, check)


def test_timeout_on_a_real_socket_is_a_request_timeout():
    async def check(t, url):
        with pytest.raises(RequestTimeout, match="timed out") as caught:
            await t.request("GET", url, "/x", 0.2)
        assert caught.value.server == url

    serve(never_answers, check)


@pytest.mark.parametrize(
    "url",
    [
        "http://" + "a" * 64 + ".example:8000",  # a host label over 63 characters: UnicodeError from IDNA
        "http://127.0.0.1:99999",
        "http://[::1",
        "ftp://127.0.0.1:21",
    ],
    ids=["long-label", "port-out-of-range", "unclosed-bracket", "not-http"],
)
def test_an_invalid_url_is_an_endpoint_error(url):
    """A URL nothing can be sent to is an EndpointError naming it (a fleet problem, not a row's)."""
    with pytest.raises(EndpointError, match="cannot send to") as caught:
        _request(url)
    assert caught.value.server == url and caught.value.url == url + "/x"


def test_an_unknown_certificate_is_a_connect_error(tmp_path):
    """https:// is verified: a self-signed certificate cannot connect (aiohttp's certificate error, mapped)."""
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
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def main():
        srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
        try:
            async with AiohttpTransport() as t:
                with pytest.raises(ConnectError, match="cannot connect: ClientConnectorCertificateError"):
                    await t.request("GET", f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}", "/x", 5)
        finally:
            srv.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_good_request_after_failures_still_works():
    """The session survives the failures above: the same transport serves a good request next."""

    async def check(t, url):
        with pytest.raises(ConnectError):
            await t.request("GET", f"http://127.0.0.1:{_closed_port()}", "/x", 5)
        with pytest.raises(EndpointError):
            await t.request("GET", "http://127.0.0.1:99999", "/x", 5)
        assert (await t.request("GET", url, "/x", 5))[0] == 200

    serve(always_ok, check)
