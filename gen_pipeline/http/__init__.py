"""HTTP: the client (status table, response parsing) over the one transport (aiohttp), and the context
overflow parser. Nothing here knows about retries or balancing.

May import: the base modules.
"""

from .client import ChatResult, Client, Transport, parse_chat, status_error
from .transport import AiohttpTransport, map_errors, open_transport

__all__ = [
    "AiohttpTransport",
    "ChatResult",
    "Client",
    "Transport",
    "map_errors",
    "open_transport",
    "parse_chat",
    "status_error",
]
