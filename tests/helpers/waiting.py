"""Bounded waiting for the tests: poll a predicate until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """True as soon as predicate() is truthy; after `timeout` seconds, its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


async def wait_until_async(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """On an event loop: poll `predicate` every 10 ms until it holds; AssertionError after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.01)
