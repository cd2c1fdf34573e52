"""Delayed and retry delivery against a real broker: nothing scheduled is lost, an undeliverable
message ends in a dead-letter topic with its reason, a far-future message pins neither memory nor
progress, and deliver_at has an upper bound."""

from __future__ import annotations

import time

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.errors import DelayTooLongError
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import Collector
from tests.helpers.waiting import wait_until

FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1)
LEVELS = "200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms"
DAY_MS = 86_400_000


def _broker(tmp_path, flush: str = "async", extra: str = "") -> BrokerProcess:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'delay_levels = "{LEVELS}"\nheartbeat_expiry_s = 5\noffset_persist_ms = 200\n{extra}')
    return BrokerProcess(tmp_path / "data", flush=flush, config=str(cfg))


def now_ms() -> int:
    return int(time.time() * 1000)


def scheduler_stats(address: str) -> dict:
    with AdminClient(address) as admin:
        return admin.broker_info()["scheduler"]


def test_a_delayed_message_whose_topic_was_deleted_lands_in_the_dlq_with_its_reason(tmp_path):
    with _broker(tmp_path) as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("doomed", 2)
            with Producer(b.address) as p:
                p.send(Message("doomed", b"too late", tag="t", deliver_at=now_ms() + 1500))
                p.send(Message("kept", b"on time", deliver_at=now_ms() + 1500))
            admin.delete_topic("doomed")  # between send and due time
            assert wait_until(lambda: len(admin.dlq_messages("%SCHEDULE%")) == 1, 20), \
                "the undeliverable message did not reach %DLQ%%SCHEDULE%"
            [dead] = admin.dlq_messages("%SCHEDULE%")
            assert wait_until(lambda: sum(hi for _, hi in admin.queue_ranges("kept")) == 1, 10)
            topics = admin.topics()
            stats = admin.broker_info()["scheduler"]
    assert dead.body == b"too late" and dead.tag == "t"
    assert dead.topic == "doomed", "the DLQ copy must name the topic it was bound for"
    assert dead.properties["DLQ_REASON"].startswith("topic_not_found"), dead.properties
    assert "doomed" not in topics, "delivery re-created a deleted topic"
    assert stats["dead_lettered"] == 1 and stats["delivered"] == 1


def test_deliver_at_beyond_max_deliver_delay_is_refused(tmp_path):
    with _broker(tmp_path, extra='max_deliver_delay = "2h"\n') as b, Producer(b.address) as p:
        with pytest.raises(DelayTooLongError, match="max_deliver_delay"):
            p.send(Message("far", b"x", deliver_at=now_ms() + 3 * 3_600_000))
        with pytest.raises(DelayTooLongError):
            p.send_async(Message("far", b"y", deliver_at=now_ms() + 3 * 3_600_000)).result(30)
        p.send(Message("far", b"ok", deliver_at=now_ms() + 3_600_000))  # within the bound
    with _broker(tmp_path / "default") as b, Producer(b.address) as p:
        with pytest.raises(DelayTooLongError):
            p.send(Message("far", b"x", deliver_at=now_ms() + 41 * DAY_MS))
        p.send(Message("far", b"ok", deliver_at=now_ms() + 39 * DAY_MS))


def test_a_far_future_message_pins_neither_memory_nor_progress(tmp_path):
    b = _broker(tmp_path).start()
    try:
        with Producer(b.address) as p:
            p.send(Message("soon", b"far", deliver_at=now_ms() + 20 * DAY_MS))
            near = [Message("soon", f"n{i}".encode(), delay_level=1) for i in range(200)]
            near += [Message("soon", f"a{i}".encode(), deliver_at=now_ms() + 500) for i in range(50)]
            for f in [p.send_async(m) for m in near]:
                f.result(30)
        col = Collector(250)
        c = Consumer("gfar", b.address, consume_from="first", **FAST).subscribe("soon")
        c.start(col)
        try:
            assert col.wait(30), f"{len(col.items)} of 250 near messages delivered"
        finally:
            c.close()
        assert b"far" not in {body for *_, body in col.items}
        with AdminClient(b.address) as admin:
            timer = admin.topics(system=True)["%TIMER%"]
        stats = scheduler_stats(b.address)
        assert stats["waiting"] == 1, stats
        assert stats["in_memory"] == 0, f"the far message (or others) are held in memory: {stats}"
        assert stats["progress"]["%SCHEDULE%:0"] == 200, "progress did not move past the near messages"
        bucket = next(q for q, (lo, hi) in enumerate(timer["ranges"]) if hi > lo and hi == 1)
        assert f"%TIMER%:{bucket}" not in stats["progress"], "the far message's bucket was read"
        near_buckets = [q for q, (lo, hi) in enumerate(timer["ranges"]) if hi == 50]
        assert [stats["progress"][f"%TIMER%:{q}"] for q in near_buckets] == [50]
        b.restart()  # a restart reads the far message no more than before
        stats = scheduler_stats(b.address)
        assert stats["in_memory"] == 0 and f"%TIMER%:{bucket}" not in stats["progress"], stats
    finally:
        b.stop()


@pytest.mark.failure
def test_kill_9_around_delivery_loses_no_delayed_message(tmp_path):
    b = _broker(tmp_path, flush="sync").start()
    sent: set[bytes] = set()
    try:
        with Producer(b.address) as p:
            base = now_ms()
            for i in range(0, 600, 50):  # due times spread over ~3 s, levels and absolute times
                batch = [Message("crashy", f"m{j}".encode(), deliver_at=base + 500 + j * 5)
                         for j in range(i, i + 50)]
                for f in [p.send_async(m) for m in batch]:
                    f.result(30)
                sent.update(m.body for m in batch)
            levels = [Message("crashy", f"l{j}".encode(), delay_level=1 + j % 8) for j in range(100)]
            for f in [p.send_async(m) for m in levels]:
                f.result(30)
            sent.update(m.body for m in levels)
        for pause in (0.6, 0.5, 0.7, 0.4):  # kill -9 while deliveries are under way
            time.sleep(pause)
            b.kill()
            b.start()
        col = Collector(len(sent))
        c = Consumer("gcrash", b.address, consume_from="first", **FAST).subscribe("crashy")
        c.start(col)
        try:
            got = lambda: {body for *_, body in col.items}  # noqa: E731
            assert wait_until(lambda: got() >= sent, 60), f"lost {len(sent - got())} delayed messages"
        finally:
            c.close()
    finally:
        b.stop()


def test_a_delivery_the_store_cannot_append_stays_pending_and_is_retried(tmp_path):
    """The commit log refuses writes (the broker's file-size limit is lowered to the log's current
    size: every append fails with EFBIG, like a full disk); the due message must wait, backing
    off, and arrive once appends work again."""
    import resource

    b = _broker(tmp_path).start()
    try:
        with Producer(b.address) as p:
            # The target queue and its index exist already, and the commit log is the largest
            # file the broker writes (the limit applies to every file: offsets, its log, ...).
            p.send_batch([Message("late", b"plain" * 20_000) for _ in range(12)], routing_key="one")
            p.send(Message("late", b"delayed", deliver_at=now_ms() + 1000), routing_key="one")
        log_dir = b.data_dir / "commitlog"
        newest = max(log_dir.iterdir(), key=lambda f: f.name)
        # where its records end: the file is longer (zero bytes: the length the writer sets ahead
        # of its records), and a write at or past the limit fails whatever the file's length
        records_end = len(newest.read_bytes().rstrip(b"\0"))
        pid = b.proc.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (records_end, hard))
        try:
            assert wait_until(lambda: scheduler_stats(b.address)["retried"] >= 2, 20), \
                "the failing delivery was not retried"
            stats = scheduler_stats(b.address)
            assert stats["backing_off"] == 1 and stats["delivered"] == 0, stats
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
        col = Collector(13)
        c = Consumer("glate", b.address, consume_from="first", **FAST).subscribe("late")
        c.start(col)
        try:
            assert col.wait(30), "the delayed message was lost after the store failed"
        finally:
            c.close()
        assert [body for *_, body in col.items].count(b"delayed") == 1
        assert scheduler_stats(b.address)["delivered"] == 1
    finally:
        b.stop()
