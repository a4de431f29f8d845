"""The one table from an HTTP status (or an error a stream carries) to the error of ours it stands for."""

from __future__ import annotations

from typing import Any

from ..errors import (
    AuthError,
    BadRequestError,
    ContextOverflowError,
    EndpointError,
    OverloadedError,
    RequestError,
    RequestTimeout,
    ServerError,
)
from .overflow import error_message, parse_overflow


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP-date: fall back to our own backoff


def status_error(status: int, body: Any, server: str, headers: Any = None, request: str = "") -> RequestError:
    """The error for a non-200 answer to `request` ("POST url"): a table from status code to class."""
    message = f"HTTP {status}: {error_message(body)}"
    if 300 <= status < 400 or status == 404:
        return _endpoint_error(status, server, headers, request)
    if status == 400:
        counts = parse_overflow(body)
        if counts is not None:
            return ContextOverflowError(message, counts=counts, server=server, status=status)
        return BadRequestError(message, server=server, status=status)
    if status in (401, 403):
        return AuthError(message, server=server, status=status)
    if status in (429, 503):
        return OverloadedError(message, server=server, status=status, retry_after=_retry_after(headers))
    if status == 408:
        return RequestTimeout(message, server=server, status=status)
    if status >= 500:
        return ServerError(message, server=server, status=status)
    return BadRequestError(message, server=server, status=status)


def _endpoint_error(status: int, server: str, headers: Any, request: str) -> EndpointError:
    """A redirect or a 404: this URL does not lead to the server's API (a wrong path, a proxy in between)."""
    location = headers.get("location") if headers is not None else None
    went = f" to {location}" if location else ""
    message = f"{request or server} answered HTTP {status}{went}: --servers must name each server's base URL"
    return EndpointError(message, server=server, status=status, url=request.partition(" ")[2])
