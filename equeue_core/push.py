"""Calling a client's push callback: shared by every transport plugin.

A push callback may be a plain function or return an awaitable (contracts.PushCallback); an
exception in it is logged, never allowed to break the connection that delivered the push.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from equeue_core.frame import Frame

log = logging.getLogger("equeue.push")


def deliver_push(on_push: Callable[[Frame], Any] | None, frame: Frame, tasks: set[asyncio.Future]) -> None:
    """Run on_push(frame); an awaitable result becomes a task kept in `tasks` until done."""
    if on_push is None:
        return
    try:
        result = on_push(frame)
    except Exception:
        log.exception("on_push callback failed")
        return
    if inspect.isawaitable(result):
        task = asyncio.ensure_future(result)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
