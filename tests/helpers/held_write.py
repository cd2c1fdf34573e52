"""Commit while a persist's durable write is held open: the check that the write runs outside
the lock commits take (the broker commits on its loop thread while a worker persists)."""

from __future__ import annotations

import threading
from typing import Any


def assert_commit_not_blocked_by_write(offsets: Any, write_name: str, key: tuple[str, str, int], offset: int) -> None:
    """`offsets.persist()` runs in a thread with the store's write method `write_name` (an
    instance attribute is put over it) held until a commit of `key` -> `offset` from another
    thread has finished; then the write goes through as it would have."""
    real_write = getattr(offsets, write_name)
    entered, release = threading.Event(), threading.Event()

    def held_write(*args: Any) -> Any:
        entered.set()
        assert release.wait(10), "the test never let the write go"
        return real_write(*args)

    setattr(offsets, write_name, held_write)
    persisting = threading.Thread(target=offsets.persist)
    persisting.start()
    try:
        assert entered.wait(10), f"persist never reached {write_name}"
        committing = threading.Thread(target=offsets.commit, args=(*key, offset))
        committing.start()
        committing.join(5)
        assert not committing.is_alive(), f"commit waited for the persist's {write_name}"
    finally:
        release.set()
        persisting.join(10)
        delattr(offsets, write_name)
    assert not persisting.is_alive()
