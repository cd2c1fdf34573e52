"""Serving requests by code: the one place a server turns a handler's outcome into a response frame.

An EQueueError becomes an error frame with its code and plain details; any other exception is a
bug, logged, and answered with `internal`, so it fails one request and never the server. One-way
requests get no answer either way. (The broker's own `Broker.handle` does the same; it can call
`dispatch` too.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from equeue_core.contracts import ServerConnection
from equeue_core.errors import EQueueError, ProtocolError, UnknownRequestError
from equeue_core.frame import Frame

Handler = Callable[[ServerConnection, Frame], Awaitable[Frame | None]]


async def dispatch(handlers: Mapping[int, Handler], conn: ServerConnection, frame: Frame,
                   log: logging.Logger, gate: Any = None) -> Frame | None:
    """`gate`: an AccessGate whose check runs before the handler (access control on)."""
    handler = handlers.get(frame.code)
    try:
        if handler is None:
            raise UnknownRequestError(f"unknown request code {frame.code}")
        if not isinstance(frame.header, dict):
            raise ProtocolError("frame header must be a map")
        if gate is not None:
            gate.check(conn, frame)
        return await handler(conn, frame)
    except EQueueError as e:
        if frame.is_oneway:
            return None
        return frame.error_response(e.code, str(e), **e.wire_details())
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.exception("request %s failed", frame.code)
        if frame.is_oneway:
            return None
        return frame.error_response("internal", f"{type(e).__name__}: {e}")


def header_int(header: Mapping[str, Any], key: str) -> int:
    """A required integer header field (ProtocolError if missing or not an int)."""
    v = header.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"header field {key!r} must be an integer")
    return v


def header_str(header: Mapping[str, Any], key: str) -> str:
    """A required string header field (ProtocolError if missing or not a str)."""
    v = header.get(key)
    if not isinstance(v, str):
        raise ProtocolError(f"header field {key!r} must be a string")
    return v
