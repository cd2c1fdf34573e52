"""Topic definitions and scheduler progress kept as small named values (the built-in stores' way).

A store engine must hand out `TopicDefinitions` and `SchedulerProgress` (contracts.py). The three
built-in stores keep both as JSON values under a key in their metadata area (the `meta` map of
offsets.json, the `meta` database / column family) and share this module for the encoding, so
the bytes are the same in every store (docs/format.md, "Metadata values"):

    "topics"             {"<topic>": <queue count>, ...}
    "schedule_progress"  {"version": 1, "queues": {"<schedule queue id>": {"next": n, "delivered": [o, ...]}}}

Before the store engine hook, scheduler progress lived in two places: the next offset of each
schedule queue as consumer offsets of group "%SCHEDULE%" on topic "%SCHEDULE%", and the delivered
offsets above it under the key "schedule_delivered". `ScheduleInMeta.load` reads that layout when
"schedule_progress" is missing, and the first `save` writes the new key and deletes the old group's
offsets, so data directories written before keep their progress.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Protocol

from equeue_core.contracts import ConsumerOffsets, ScheduleQueueProgress
from equeue_core.errors import StoreError

TOPICS_KEY = "topics"
SCHEDULE_KEY = "schedule_progress"
LEGACY_SCHEDULE_GROUP = "%SCHEDULE%"
LEGACY_SCHEDULE_TOPIC = "%SCHEDULE%"
LEGACY_DELIVERED_KEY = "schedule_delivered"


class MetaValues(Protocol):
    """Named byte values a store keeps durably: write returns once the value is durable."""

    def read(self, key: str) -> bytes | None: ...
    def write(self, key: str, value: bytes) -> None: ...


def _json(raw: bytes, key: str) -> object:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise StoreError(f"stored metadata {key!r} is damaged: {e}") from e


class TopicsInMeta:
    """TopicDefinitions as one JSON value."""

    def __init__(self, meta: MetaValues) -> None:
        self._meta = meta

    def load(self) -> dict[str, int]:
        raw = self._meta.read(TOPICS_KEY)
        doc = _json(raw, TOPICS_KEY) if raw else {}
        if not isinstance(doc, dict):
            raise StoreError(f"stored metadata {TOPICS_KEY!r} is not a map of topic -> queue count")
        return {str(t): int(n) for t, n in doc.items()}

    def save(self, topics: Mapping[str, int]) -> None:
        self._meta.write(TOPICS_KEY, json.dumps(dict(topics), sort_keys=True).encode())


class ScheduleInMeta:
    """SchedulerProgress as one JSON value, reading the older layout once (module docstring)."""

    def __init__(self, meta: MetaValues, offsets: ConsumerOffsets) -> None:
        self._meta = meta
        self._offsets = offsets

    def load(self) -> dict[int, ScheduleQueueProgress]:
        raw = self._meta.read(SCHEDULE_KEY)
        if raw is None:
            return self._load_legacy()
        doc = _json(raw, SCHEDULE_KEY)
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise StoreError(f"stored metadata {SCHEDULE_KEY!r} is not a version 1 document")
        return {int(q): ScheduleQueueProgress(int(v["next"]), frozenset(int(o) for o in v.get("delivered", ())))
                for q, v in doc.get("queues", {}).items()}

    def _load_legacy(self) -> dict[int, ScheduleQueueProgress]:
        raw = self._meta.read(LEGACY_DELIVERED_KEY)
        delivered = {int(q): v for q, v in _json(raw, LEGACY_DELIVERED_KEY).items()} if raw else {}
        out = {}
        for (group, topic, q), nxt in self._offsets.all().items():
            if group == LEGACY_SCHEDULE_GROUP and topic == LEGACY_SCHEDULE_TOPIC:
                out[q] = ScheduleQueueProgress(nxt, frozenset(o for o in delivered.get(q, ()) if o >= nxt))
        return out

    def save(self, progress: Mapping[int, ScheduleQueueProgress]) -> None:
        doc = {"version": 1, "queues": {str(q): {"next": p.next_offset, "delivered": sorted(p.delivered)}
                                        for q, p in sorted(progress.items())}}
        self._meta.write(SCHEDULE_KEY, json.dumps(doc, separators=(",", ":")).encode())
        if any(g == LEGACY_SCHEDULE_GROUP for g, _t, _q in self._offsets.all()):
            self._offsets.delete_group(LEGACY_SCHEDULE_GROUP)
