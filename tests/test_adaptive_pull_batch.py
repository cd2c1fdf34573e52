"""The default pull batch adapts per queue: it grows while a queue has a backlog and shrinks back
once the queue is caught up; an explicit pull_batch stays fixed."""

from __future__ import annotations

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.pull_batch import PULL_BATCH_CEILING, PULL_BATCH_FLOOR, AdaptivePullBatch
from tests.helpers.counting import CountingHandler
from tests.helpers.waiting import wait_until


def test_pull_batch_doubles_on_full_pulls_with_a_backlog_and_halves_when_caught_up():
    b = AdaptivePullBatch()
    assert b.size == PULL_BATCH_FLOOR
    sizes = [b.update(b.size, next_offset=100, max_offset=100_000) for _ in range(10)]
    assert sizes[:3] == [64, 128, 256] and sizes[-1] == PULL_BATCH_CEILING
    assert b.update(10, next_offset=100, max_offset=100_000) == PULL_BATCH_CEILING  # short pull: a filter, not idle
    down = [b.update(0, next_offset=500, max_offset=500) for _ in range(10)]
    assert down[0] == PULL_BATCH_CEILING // 2 and down[-1] == PULL_BATCH_FLOOR
    assert b.peak == PULL_BATCH_CEILING


def test_default_consumer_pulls_a_backlog_in_growing_batches_then_shrinks_when_idle(file_broker):
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("backlog", 1)
    with Producer(file_broker.address) as p:
        for _ in range(10):
            p.send_batch([Message("backlog", b"x" * 100) for _ in range(1000)])
    counted = CountingHandler(0)
    c = Consumer("adaptive", file_broker.address, consume_from="first", hold_ms=200).subscribe("backlog")
    c.start(counted)
    try:
        assert wait_until(lambda: counted.seen >= 10_000, timeout=120)
        assert c.stats["pull_batch_peak"] > PULL_BATCH_FLOOR  # grew on the backlog
        # caught up: every pull (held at most 200 ms) finds nothing more, so the batch halves back
        assert wait_until(lambda: c.pull_batches() == {("backlog", 0): PULL_BATCH_FLOOR}, timeout=60)
    finally:
        c.close()


def test_an_explicit_pull_batch_stays_fixed(file_broker):
    with Producer(file_broker.address) as p:
        p.send_batch([Message("fixed", b"y") for _ in range(2000)])
    c = Consumer("fixed", file_broker.address, consume_from="first", pull_batch=64).subscribe("fixed")
    c.start(lambda m: None)
    try:
        assert wait_until(lambda: c.stats["handled"] >= 2000, timeout=60)
        assert set(c.pull_batches().values()) == {64}
        assert c.stats["pull_batch_peak"] == 0
    finally:
        c.close()


def test_a_pull_answer_fits_the_brokers_frame_limit_whatever_batch_the_consumer_asks(tmp_path):
    """A consumer asking 1024 records of ~280 bytes (~290 KB) from a broker whose max_frame_size is
    65000: the broker answers what fits a frame instead of failing the pull, so the backlog drains.
    (The adaptive batch reached this size and stalled the consumer before the broker capped it.)"""
    from tests.helpers.broker import BrokerProcess
    from tests.helpers.consume import consume

    cfg = tmp_path / "b.toml"
    cfg.write_text("max_frame_size = 65000\nmax_body_size = 16384\n")
    with BrokerProcess(tmp_path / "data", config=str(cfg)).start() as b:
        with Producer(b.address) as p:
            for _ in range(30):
                p.send_batch([Message("small-frames", b"x" * 200) for _ in range(100)], routing_key="k")
        assert len(consume(b.address, "g", "small-frames", 3000, timeout=60, pull_batch=1024).items) == 3000


def test_a_queue_with_a_known_backlog_starts_pulling_at_that_backlog_not_at_the_floor():
    b = AdaptivePullBatch()
    assert b.expect(100) == 100 and b.peak == 100
    assert AdaptivePullBatch().expect(5) == PULL_BATCH_FLOOR
    assert AdaptivePullBatch().expect(10**6) == PULL_BATCH_CEILING
    # past the ceiling only a backlog that fits `whole` (the push Consumer's flow window) at once
    assert AdaptivePullBatch(32, 500).expect(750, whole=1000) == 750
    assert AdaptivePullBatch(32, 500).expect(1001, whole=1000) == 500
    assert AdaptivePullBatch(32, 500).expect(750) == 500
    grown = AdaptivePullBatch(32, 500)
    grown.expect(750, whole=1000)
    assert grown.update(750, 750, 760) == 500  # more arrived meanwhile: back within the ceiling


@pytest.mark.parametrize("backlog, pulls", [(750, 2), (1500, 4)])
def test_a_consumer_reads_a_backlog_that_fits_its_flow_window_in_one_pull(file_broker, backlog, pulls):
    """The push Consumer's pull batch stops at half its flow window (1000 messages by default),
    so that a pull can be in flight while the handler works through the one before. A queue's
    backlog of 750 has no second pull to overlap: it is read in one (plus the held pull after
    it), where it took 500 and 250. One larger than the window still goes 500 at a time."""
    topic = f"backlog{backlog}"
    with AdminClient(file_broker.address) as admin:
        admin.create_topic(topic, 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message(topic, b"z" * 10) for _ in range(backlog)])
    counted = CountingHandler(0)
    c = Consumer(topic, file_broker.address, consume_from="first", hold_ms=20_000).subscribe(topic)
    c.start(counted)
    try:
        assert wait_until(lambda: counted.seen >= backlog and c.stats["pulls"] >= pulls, timeout=60)
        assert wait_until(lambda: c._async.queues[(topic, 0)].next_offset == backlog, timeout=10)
        assert c.stats["pulls"] == pulls, f"{c.stats['pulls']} pulls for {backlog} messages in one queue"
    finally:
        c.close()


def test_a_consumer_reads_a_queue_of_100_messages_in_one_pull_not_growing_from_32(file_broker):
    """Before: 32, 64, then the last 4 (three pulls a queue; at 1000 queues of ~100 messages
    each, 3000 round trips). The start offset's answer tells the queue's end, so the first pull
    asks for the whole backlog. hold_ms is long so the one held pull after it is the only other."""
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("hundred", 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message("hundred", b"z" * 10) for _ in range(100)])
    counted = CountingHandler(0)
    c = Consumer("hundred", file_broker.address, consume_from="first", hold_ms=20_000).subscribe("hundred")
    c.start(counted)
    try:
        assert wait_until(lambda: counted.seen >= 100 and c.stats["pulls"] >= 2, timeout=60)
        assert c.stats["pulls"] == 2, f"{c.stats['pulls']} pulls for 100 messages in one queue"
    finally:
        c.close()
