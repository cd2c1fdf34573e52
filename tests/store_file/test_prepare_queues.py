"""A new queue's index directory and first file, made ahead of its first append on another thread
(FileQueueIndex.prepare, the broker's QueuePreparer): only ever a head start. The first append
finds them, or makes them itself; a prepared queue that was never written reopens as an empty
queue; and a queue whose first entry comes past its prepared file (a replica's first copied run,
a queue whose first offsets were deleted) leaves no empty file below it to read as a hole."""

from __future__ import annotations

import os
import threading
import time

from equeue_plugins.store_file.constants import INDEX_DIR, file_name
from equeue_plugins.store_file.queue_index import FileQueueIndex

from equeue_core.client import AdminClient, Message, Producer
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import consume

from .helpers import append, crash, open_store, read_all, settings


def _entries(n: int, position: int = 0) -> bytes:
    return b"".join(INDEX_ENTRY.pack(position + i * 100, 100, 0) for i in range(n))


def _files(root, topic: str, queue_id: int) -> list[str]:
    return sorted(os.listdir(os.path.join(root, INDEX_DIR, topic, str(queue_id))))


def test_prepare_makes_each_new_queue_s_directory_and_empty_first_file_and_skips_known_ones(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 3, queue_id=1)
    assert store.prepare_queues("t", range(4)) == 3  # queue 1 is written: skipped
    for q in (0, 2, 3):
        assert _files(tmp_path, "t", q) == [file_name(0)]
        assert os.path.getsize(tmp_path / INDEX_DIR / "t" / str(q) / file_name(0)) == 0
    assert store.prepare_queues("t", range(4)) == 3  # not written yet: prepared again, harmlessly
    append(store, 5, queue_id=2)
    assert [m.body for m in read_all(store, queue_id=2)] == [b"m-%d" % i for i in range(5)]
    assert store.queue_range("t", 0) == (0, 0)
    store.close()
    store, report = open_store(tmp_path)
    assert report.clean and not report.notes
    assert [store.queue_range("t", q) for q in range(4)] == [(0, 0), (0, 3), (0, 5), (0, 0)]
    assert store.queues() == {"t": [1, 2]}  # the written ones, as without prepare (a replica's list)
    append(store, 2, queue_id=0)  # a prepared, never written queue after a reopen: starts at 0
    assert [m.queue_offset for m in read_all(store, queue_id=0)] == [0, 1]
    assert store.queues() == {"t": [0, 1, 2]}
    store.close()


def test_a_prepared_queue_survives_a_crash_and_its_first_append_after_it(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 4, topic="a")
    store.prepare_queues("b", range(2))
    crash(store)
    store, report = open_store(tmp_path)
    assert not report.rebuilt and not report.lost, report
    append(store, 3, topic="b", queue_id=1)
    assert [m.body for m in read_all(store, "b", 1)] == [b"m-0", b"m-1", b"m-2"]
    store.close()


def test_a_queue_starting_past_its_prepared_file_leaves_no_empty_file_below_it(tmp_path) -> None:
    s = settings(tmp_path)  # 64 entries a file
    index = FileQueueIndex(s)
    index.prepare("t", [0, 1, 2])
    index.add("t", 0, 100, _entries(3))  # the first entry at 100: file 64 holds it, file 0 goes
    index.add("t", 1, 5, _entries(3))  # inside file 0: the prepared file is the one written
    index.close()
    index = FileQueueIndex(s)  # queue 2: prepared, never written, loaded from disk
    index.add("t", 2, 200, _entries(2))
    index.close()
    index = FileQueueIndex(s)
    assert _files(tmp_path, "t", 0) == [file_name(64)]
    assert _files(tmp_path, "t", 1) == [file_name(0)]
    assert _files(tmp_path, "t", 2) == [file_name(192)]
    # (a reopened index knows a queue's first offset to its first file; the store keeps the rest)
    assert [index.queue_range("t", q) for q in range(3)] == [(64, 103), (0, 8), (192, 202)]
    assert [index.first_hole("t", q) for q in range(3)] == [None, None, None]
    assert bytes(index.read("t", 0, 100, 10)) == _entries(3)
    assert len(index.read("t", 1, 5, 10)) == 3 * INDEX_ENTRY_SIZE
    index.close()


def test_prepare_racing_the_first_appends_of_the_same_queues_loses_nothing(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    queues = 64
    done = threading.Event()

    def prepare() -> None:
        for _ in range(20):
            store.prepare_queues("race", range(queues))
        done.set()

    worker = threading.Thread(target=prepare)
    worker.start()
    try:
        for round_ in range(5):
            for q in range(queues):
                append(store, 2, topic="race", queue_id=q, first_number=2 * round_)
    finally:
        worker.join(60)
    assert done.is_set()
    for q in range(queues):
        assert [m.body for m in read_all(store, "race", q)] == [b"m-%d" % i for i in range(10)]
    store.close()
    store, report = open_store(tmp_path)
    assert report.clean and not report.notes
    assert all(store.queue_range("race", q) == (0, 10) for q in range(queues))
    store.close()


def test_the_broker_makes_a_new_topic_s_queue_files_before_its_first_message(tmp_path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data) as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("fresh", 8)
            first_files = [data / INDEX_DIR / "fresh" / str(q) / file_name(0) for q in range(8)]
            deadline = time.monotonic() + 20
            while not all(f.exists() for f in first_files) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert all(f.exists() for f in first_files), [f for f in first_files if not f.exists()]
            assert all(f.stat().st_size == 0 for f in first_files)
            admin.create_topic("fresh", 12)  # more queues: the new ones too
            more = [data / INDEX_DIR / "fresh" / str(q) / file_name(0) for q in range(8, 12)]
            deadline = time.monotonic() + 20
            while not all(f.exists() for f in more) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert all(f.exists() for f in more)
        with Producer(b.address) as p:
            p.send_batch([Message("fresh", b"%d" % i) for i in range(40)], routing_key="k")
    with BrokerProcess(data) as b:  # a restart: prepared, never written queues load as empty ones
        col = consume(b.address, "g", "fresh", 40)
        assert sorted(int(item[3]) for item in col.items) == list(range(40))
