"""Helpers of the Spark tests: bodies that carry their own checksum, and real on-disk data written
through each store plugin's own engine (the code path the broker appends with)."""

from __future__ import annotations

import zlib
from typing import Any

from equeue_core import record
from equeue_core.contracts import StoreSettings
from equeue_core.plugins import get_plugin_manager

# ---------------------------------------------------------------- data


def make_body(queue_id: int, i: int, salt: str = "") -> bytes:
    """A body whose last 8 bytes are the crc32 (hex) of the rest: a torn or mixed-up body fails
    check_body. The length varies with i so records are not all the same size."""
    payload = f"{salt}q{queue_id}-i{i}-".encode() + b"x" * (i % 37)
    return payload + b"%08x" % zlib.crc32(payload)


def check_body(body: bytes) -> bool:
    return len(body) >= 8 and b"%08x" % zlib.crc32(body[:-8]) == body[-8:]


class StoreWriter:
    """A store plugin's engine opened on a data dir, appending real records."""

    def __init__(self, store_name: str, data_dir: str) -> None:
        self.engine = get_plugin_manager().store_engine(store_name)(StoreSettings(data_dir=data_dir))
        self.store = self.engine.messages

    def append(self, topic: str, queue_id: int, bodies: list[bytes], chunk: int = 1000,
               born_ts: int | None = None, tag: str | None = None) -> None:
        for s in range(0, len(bodies), chunk):
            batch = bytearray(b"".join(
                record.encode_record(topic, b, tag=tag, keys=(f"k{queue_id}",), queue_id=queue_id,
                                     born_ts=born_ts) for b in bodies[s:s + chunk]))
            self.store.append(topic, queue_id, batch, record.scan(batch))
        self.store.flush()

    def close(self) -> None:
        self.engine.close()


def fill(store_name: str, data_dir: str, topic: str, per_queue: dict[int, tuple[int, int]],
         salt: str = "") -> None:
    """Append bodies make_body(q, i) for i in [start, end) to each queue q."""
    w = StoreWriter(store_name, data_dir)
    try:
        for q, (start, end) in sorted(per_queue.items()):
            w.append(topic, q, [make_body(q, i, salt) for i in range(start, end)])
    finally:
        w.close()


def commit_offsets(store_name: str, data_dir: str, offsets: dict[tuple[str, str, int], int]) -> None:
    """Persist group offsets through the store engine's own ConsumerOffsets."""
    engine = get_plugin_manager().store_engine(store_name)(StoreSettings(data_dir=data_dir))
    try:
        for (g, t, q), o in offsets.items():
            engine.offsets.commit(g, t, q, o)
        engine.offsets.persist()
    finally:
        engine.close()


def read_df(spark: Any, store_name: str, data_dir: str, topic: str, **options: str) -> Any:
    r = spark.read.format("equeue").option("store", store_name).option("path", data_dir).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()
