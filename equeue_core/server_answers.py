"""How a transport's server turns what a handler did into the answer frame: one rule for every
transport (plugins/transport_tcp, plugins/transport_zmq), so a client sees the same error frames
whichever it speaks.

- A handler that raises an EQueueError is answered with its code, message and details.
- Any other exception is a bug in the handler: it is logged with its traceback and answered with
  code "error"; it never takes the server (or the connection) down.
- CancelledError (the connection closed, the server is stopping) passes through unanswered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from equeue_core.errors import EQueueError
from equeue_core.frame import Frame

log = logging.getLogger(__name__)

Answer = Frame | None  # None: no answer (a one-way request)


def plain_details(details: Mapping[Any, object]) -> dict[str, object]:
    """Error details as msgpack-safe values (anything else becomes its str). Used for errors the
    transport answers itself: a handler that raised an EQueueError, a response over the frame
    maximum, a refused connection. Broker.handle and dispatch() answer a handler's errors
    themselves and leave out details that are not int/str/float (docs/protocol.md, "Error frames")."""
    return {str(k): v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
            for k, v in details.items()}


def error_answer(request: Frame, error: BaseException) -> Frame:
    """The error frame that answers `request` when its handler raised `error`."""
    if isinstance(error, EQueueError):
        return request.error_response(error.code, str(error), **plain_details(error.details))
    log.error("handler failed on request code %s", request.code, exc_info=error)
    return request.error_response("error", f"{type(error).__name__}: {error}")


def answer_now(handler: Any, conn: Any, request: Frame) -> Answer | Awaitable[Answer]:
    """`handler.handle_now` (contracts.ImmediateServerHandler) with its errors answered: the
    answer (a Frame, or None for none), or the awaitable rest of a request that must wait."""
    try:
        response = handler.handle_now(conn, request)
    except Exception as e:
        return error_answer(request, e)
    return response


async def answer(handler: Any, conn: Any, request: Frame, rest: Awaitable[Answer] | None = None) -> Answer:
    """Await `handler.handle(conn, request)` (or `rest`, what handle_now left to wait for) with its
    errors answered."""
    try:
        return await (handler.handle(conn, request) if rest is None else rest)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        return error_answer(request, e)
