"""A server that costs next to nothing: one canned chat completion on every port, for client-bound runs.

    python bench/canned.py PORT [PORT ...]        (prints "canned ready" once every port listens)

The simulator counts each prompt with the chat template and generates words (0.5-0.7 ms of one core per
request on the bench's VM), so on 2 cores it, not the client, sets the pace. This server parses the request
with httptools and sends the same small reply every time (~0.05 ms), so a client's own CPU sets its req/s and
`--workers 2` can use the second core. It answers what gen-pipeline's discovery asks (`/v1/models` with a
context length) and 200 `{}` to any other GET; its usage block has no prompt_tokens, so no token drift is
recorded. Not a model of SGLang: only for measuring clients.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import httptools
import orjson

MODELS = orjson.dumps({"object": "list", "data": [{"id": "canned", "object": "model", "max_model_len": 32768}]})
COMPLETION = orjson.dumps(
    {
        "id": "canned",
        "object": "chat.completion",
        "model": "canned",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "alpha bravo cedar delta ember fjord grove harbor"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": None, "completion_tokens": 8, "total_tokens": None},
    }
)


def reply(body: bytes, status: bytes = b"200 OK") -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (status, len(body))
    return head + body


class Canned(asyncio.Protocol):
    """One keep-alive connection: each complete request gets its reply at once."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(reply(b"{}", b"400 Bad Request"))
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.parser.get_method() == b"POST":
            self.transport.write(reply(COMPLETION))
        elif self.url.startswith(b"/v1/models"):
            self.transport.write(reply(MODELS))
        else:
            self.transport.write(reply(b"{}"))


async def serve(ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Canned, "127.0.0.1", port) for port in ports]
    print("canned ready", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(serve([int(p) for p in sys.argv[1:]]))
