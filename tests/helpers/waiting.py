"""Bounded waiting for the tests: poll a predicate until it holds or a deadline passes."""

from __future__ import annotations

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
