"""Helpers shared by the store conformance tests and the subprocess scripts they start.

Plain module (no relative imports) so the scripts can import it by path. Record contents are a
pure function of (topic, queue, queue offset), so any process can check a record it reads
without being told what was written.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from equeue_core import record
from equeue_core.contracts import MessageStore, QueueIndex, RecoveryReport, StoreEngine, StoreSettings
from equeue_core.plugins import get_plugin_manager

HERE = os.path.dirname(os.path.abspath(__file__))
TAGS = ("a", "b", None)
BORN_BASE = 1_700_000_000_000


def store_names() -> list[str]:
    return get_plugin_manager().names("equeue_store_engines")


def tag_for(offset: int) -> str | None:
    return TAGS[offset % 3]


def body_for(topic: str, queue_id: int, offset: int) -> bytes:
    """A body whose length varies (20..1200 B) and whose bytes say where it belongs."""
    head = f"{topic}/{queue_id}/{offset}|".encode()
    size = 20 + (offset * 7919) % 1180
    return (head * (size // len(head) + 1))[:max(size, len(head))]


def keys_for(offset: int) -> tuple[str, ...]:
    return (f"k{offset}", f"order-{offset // 10}") if offset % 2 else ()


def props_for(offset: int) -> dict[str, str]:
    return {"n": str(offset)} if offset % 5 == 0 else {}


def make_batch(topic: str, queue_id: int, first_offset: int, count: int) -> tuple[bytearray, list[int]]:
    """A producer batch for queue offsets [first_offset, first_offset + count) and its starts."""
    parts = [record.encode_record(topic, body_for(topic, queue_id, o), tag=tag_for(o), keys=keys_for(o),
                                  properties=props_for(o), queue_id=queue_id, born_ts=BORN_BASE + o)
             for o in range(first_offset, first_offset + count)]
    buf = bytearray(b"".join(parts))
    return buf, record.scan(buf)


def check_message(msg: record.StoredMessage, topic: str, queue_id: int, offset: int) -> None:
    """Assert a decoded record is exactly the one make_batch laid out for that offset."""
    assert (msg.topic, msg.queue_id, msg.queue_offset) == (topic, queue_id, offset)
    assert msg.body == body_for(topic, queue_id, offset), f"body of {topic}/{queue_id}@{offset} differs"
    assert msg.tag == tag_for(offset)
    assert msg.keys == keys_for(offset)
    assert msg.properties == props_for(offset)
    assert msg.born_ts == BORN_BASE + offset


def verified_messages(buf: bytes | bytearray | memoryview) -> list[record.StoredMessage]:
    """Decode a run of records, checking every crc first (a torn record fails here)."""
    out = []
    for s in record.scan(buf):
        record.verify(buf, s)
        out.append(record.decode(buf, s))
    return out


def read_all(store: MessageStore, topic: str, queue_id: int, start: int, end: int,
             tag_hashes: frozenset[int] | None = None, max_count: int = 97) -> list[record.StoredMessage]:
    """Every record of [start, end) by repeated pulls, following next_offset (bounded loop)."""
    out: list[record.StoredMessage] = []
    offset = start
    for _ in range(end - start + 2):
        if offset >= end:
            break
        res = store.read_queue(topic, queue_id, offset, max_count, 1 << 24, tag_hashes)
        assert res.next_offset > offset, "a pull below the max offset made no progress"
        out.extend(verified_messages(res.records))
        offset = res.next_offset
    assert offset == end, f"pulls ended at {offset}, expected {end}"
    return out


def queue_bytes(store: MessageStore, topic: str, queue_id: int) -> bytes:
    """The stored bytes of a queue's whole range, as pulls serve them: two stores hold the same
    queue exactly when these are equal (a replica against its master)."""
    lo, hi = store.queue_range(topic, queue_id)
    out, offset = [], lo
    for _ in range(hi - lo + 1):
        if offset >= hi:
            break
        res = store.read_queue(topic, queue_id, offset, 4096, 1 << 24)
        out.append(bytes(res.records))
        offset = res.next_offset
    return b"".join(out)


@dataclass
class Opened:
    """A store engine opened the way the broker opens it, with short names for its parts."""

    engine: StoreEngine
    closed: bool = False

    @property
    def store(self) -> MessageStore:
        return self.engine.messages

    @property
    def index(self) -> QueueIndex:
        return self.engine.index

    @property
    def report(self) -> RecoveryReport:
        return self.engine.recovery

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.engine.close()


def open_store(name: str, data_dir: str, flush: str = "async", interval_ms: int = 50, **options: Any) -> Opened:
    settings = StoreSettings(data_dir=data_dir, flush=flush, flush_interval_ms=interval_ms, options=options)
    return Opened(get_plugin_manager().store_engine(name)(settings))


def append(opened: Opened, topic: str, queue_id: int, count: int) -> Any:
    first = opened.store.queue_range(topic, queue_id)[1]
    buf, starts = make_batch(topic, queue_id, first, count)
    res = opened.store.append(topic, queue_id, buf, starts)
    assert res.first_queue_offset == first
    return res


@dataclass
class Child:
    """A subprocess running one of this directory's scripts; always stopped by `stop`."""

    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    _partial: bytes = b""

    @classmethod
    def start(cls, script: str, *args: str, prefix: tuple[str, ...] = ()) -> Child:
        """Run script with args; `prefix` is a command to run it under (e.g. faketime)."""
        proc = subprocess.Popen([*prefix, sys.executable, os.path.join(HERE, script), *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return cls(proc)

    def read_until(self, predicate: Any, timeout: float) -> bool:
        """Collect complete stdout lines until predicate(lines) holds, EOF, or timeout."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return False
                chunk = os.read(fd, 65536)
                if not chunk:
                    return predicate(self.lines)
                self._absorb(chunk)
        return True

    def _absorb(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        self.lines.extend(c.decode() for c in complete)

    def drain(self, timeout: float = 30) -> str:
        """After the process ended (or to end it): collect the rest of stdout, return stderr.
        A partial last line (cut by a kill) is dropped: it was never fully written."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            out, err = self.proc.communicate(timeout=10)
        self._absorb(out)
        return err.decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
