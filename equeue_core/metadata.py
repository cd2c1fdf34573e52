"""Topic definitions and scheduler progress kept as small named values (the built-in stores' way).

A store engine must hand out `TopicDefinitions` and `SchedulerProgress` (contracts.py). The three
built-in stores keep both as JSON values under a key in their metadata area (the `meta` map of
offsets.json, the `meta` database / column family) and share this module for the encoding, so
the bytes are the same in every store (docs/format.md, "Metadata values"):

    "topics"             {"<topic>": <queue count>, ...}
    "schedule_progress"  {"version": 2,
                          "queues": {"<topic>:<queue id>": {"next": n, "delivered": [o, ...]}, ...},
                          "timer": {"open_from": ms | null, "bucket_ms": ms | null, "buckets": n | null}}

Version 1 of "schedule_progress" keyed queues by their `%SCHEDULE%` queue id alone and had no
"timer"; it is read as those `%SCHEDULE%` queues.

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

from equeue_core.contracts import ConsumerOffsets, ScheduleQueueProgress, ScheduleState
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

    def load(self) -> ScheduleState:
        raw = self._meta.read(SCHEDULE_KEY)
        if raw is None:
            return self._load_legacy()
        doc = _json(raw, SCHEDULE_KEY)
        if not isinstance(doc, dict) or doc.get("version") not in (1, 2):
            raise StoreError(f"stored metadata {SCHEDULE_KEY!r} is not a version 1 or 2 document")
        state = ScheduleState()
        for name, v in doc.get("queues", {}).items():
            if doc["version"] == 1:
                key = (LEGACY_SCHEDULE_TOPIC, int(name))
            else:
                topic, _, q = name.rpartition(":")
                key = (topic, int(q))
            state.queues[key] = ScheduleQueueProgress(int(v["next"]),
                                                      frozenset(int(o) for o in v.get("delivered", ())))
        timer = doc.get("timer") or {}
        state.timer_open_from = timer.get("open_from")
        state.timer_bucket_ms = timer.get("bucket_ms")
        state.timer_buckets = timer.get("buckets")
        return state

    def _load_legacy(self) -> ScheduleState:
        raw = self._meta.read(LEGACY_DELIVERED_KEY)
        delivered = {int(q): v for q, v in _json(raw, LEGACY_DELIVERED_KEY).items()} if raw else {}
        state = ScheduleState()
        for (group, topic, q), nxt in self._offsets.all().items():
            if group == LEGACY_SCHEDULE_GROUP and topic == LEGACY_SCHEDULE_TOPIC:
                state.queues[(topic, q)] = ScheduleQueueProgress(
                    nxt, frozenset(o for o in delivered.get(q, ()) if o >= nxt))
        return state

    def save(self, state: ScheduleState) -> None:
        doc = {"version": 2,
               "queues": {f"{t}:{q}": {"next": p.next_offset, "delivered": sorted(p.delivered)}
                          for (t, q), p in sorted(state.queues.items())},
               "timer": {"open_from": state.timer_open_from, "bucket_ms": state.timer_bucket_ms,
                         "buckets": state.timer_buckets}}
        self._meta.write(SCHEDULE_KEY, json.dumps(doc, separators=(",", ":")).encode())
        if any(g == LEGACY_SCHEDULE_GROUP for g, _t, _q in self._offsets.all()):
            self._offsets.delete_group(LEGACY_SCHEDULE_GROUP)
