"""HTTP: the client (response parsing, whole or streamed) over the one transport (aiohttp), the one status
table, and the context overflow parser. Nothing here knows about retries or balancing.

May import: the base modules.
"""

from .client import ChatResult, Client, Transport, parse_chat
from .sse import StreamBody, Watch
from .status import status_error
from .transport import AiohttpTransport, map_errors, open_transport

__all__ = [
    "AiohttpTransport",
    "ChatResult",
    "Client",
    "StreamBody",
    "Transport",
    "Watch",
    "map_errors",
    "open_transport",
    "parse_chat",
    "status_error",
]
