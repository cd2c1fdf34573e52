"""Storing the sections of a SEND_MULTI (broker/multi_send.py) with one call to the store.

A store may offer `append_sections(sections)`, with the contract of `append_sections` below: the
file store does, writing every section's records with one write(2) where one `append` per section
wrote each section's (a SEND_MULTI of 100 topics has ~100 sections, and the log write was a
third of what a section cost the broker: docs/benchmarks.md, "Many topics in one frame"). Any
other store is called once per section (`append_one_by_one`), which keeps the same contract, so
a store plugin needs nothing new; the conformance kit runs both ways over every store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue_core.contracts import AppendResult
from equeue_core.errors import EQueueError

Section = tuple[str, int, bytearray, Sequence[int]]  # topic, queue id, batch, record.scan(batch)


def append_sections(store: Any, sections: Sequence[Section]) -> tuple[list[AppendResult], EQueueError | None]:
    """Store each (topic, queue_id, batch, starts) section as `store.append` would, in order:
    the AppendResult of each section stored and None; or, when a section cannot be stored, the
    results of those before it and its error (it and every later section not stored). Raises
    that error when not even the first section was stored."""
    own = getattr(store, "append_sections", None)
    if own is None:
        return append_one_by_one(store, sections)
    return own(sections)


def append_one_by_one(store: Any, sections: Sequence[Section]) -> tuple[list[AppendResult], EQueueError | None]:
    """`append_sections` through the store's `append`, one call per section."""
    results: list[AppendResult] = []
    for topic, queue_id, batch, starts in sections:
        try:
            results.append(store.append(topic, queue_id, batch, starts))
        except EQueueError as e:
            if not results:
                raise
            return results, e
    return results, None
