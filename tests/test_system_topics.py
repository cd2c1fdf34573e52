"""System topics (%RETRY%…, %DLQ%…, %SCHEDULE%, %TIMER%, %QUARANTINE%) belong to the broker:
producers are refused even when the topic exists, the broker's own paths still write them, and a
malformed record found in one is quarantined instead of breaking delivery."""

from __future__ import annotations

import time

import pytest

from equeue_core import record
from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.codes import Code
from equeue_core.config import Config
from equeue_core.contracts import StoreSettings
from equeue_core.errors import SystemTopicError
from equeue_core.plugins import get_plugin_manager
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import Collector
from tests.helpers.waiting import wait_until

FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1)
LEVELS = "200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms"


@pytest.fixture
def fast_broker(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'delay_levels = "{LEVELS}"\nheartbeat_expiry_s = 5\noffset_persist_ms = 200\n')
    with BrokerProcess(tmp_path / "data", config=str(cfg)) as b:
        yield b


def test_producers_cannot_write_into_existing_system_topics(fast_broker):
    with Producer(fast_broker.address) as p:
        p.send(Message("work", b"fails once"))
    col = Collector(2)
    failed = []

    def handler(m):
        if not failed:
            failed.append(m.msg_id)
            raise RuntimeError("first attempt fails")  # the broker's send-back writes %RETRY%gsys
        col(m)

    c = Consumer("gsys", fast_broker.address, consume_from="first", **FAST).subscribe("work")
    c.start(handler)
    try:
        assert wait_until(lambda: len(col.items) == 1, 20), "the retry (a broker path) did not arrive"
    finally:
        c.close()
    with AdminClient(fast_broker.address) as admin:
        existing = set(admin.topics(system=True))
    assert {"%RETRY%gsys", "%SCHEDULE%", "%TIMER%"} <= existing
    with Producer(fast_broker.address) as p:
        for topic in ("%RETRY%gsys", "%SCHEDULE%", "%TIMER%", "%DLQ%gsys", "%QUARANTINE%"):
            with pytest.raises(SystemTopicError, match="system topic"):
                p.send(Message(topic, b"forged"))
            with pytest.raises(SystemTopicError):
                p.send_batch([Message(topic, b"forged"), Message(topic, b"forged too")])
            with pytest.raises(SystemTopicError):
                p.send(Message(topic, b"forged", delay_level=1))
    # A client that skips the producer's route check (no create) and sends SEND frames itself:
    # single, batch and delayed.
    for topic in ("%RETRY%gsys", "%SCHEDULE%", "%TIMER%"):
        for header, n in (({}, 1), ({}, 3), ({"delay_level": 1}, 1)):
            with pytest.raises(SystemTopicError, match="system topic"):
                run_sync(_raw_send(fast_broker.address, topic, n, header))
    with AdminClient(fast_broker.address) as admin:
        ranges = {t: admin.queue_ranges(t) for t in ("%RETRY%gsys", "%SCHEDULE%")}
    assert sum(hi for _, hi in ranges["%RETRY%gsys"]) == 1, "a forged record reached the retry topic"
    assert sum(hi for _, hi in ranges["%SCHEDULE%"]) == 1


async def _raw_send(address: str, topic: str, n: int, extra: dict) -> None:
    conn = await BrokerConnection(address).connect()
    try:
        await conn.request(Code.ROUTE, {"topic": topic})  # allowed: routes of system topics are public
        body = b"".join(record.encode_record(topic, b"forged %d" % i) for i in range(n))
        await conn.request(Code.SEND, {"topic": topic, "queue_id": 0, **extra}, body)
    finally:
        await conn.close()


def _append_offline(data_dir, topic: str, queue_id: int, records: list[bytes]) -> None:
    """Write records into a stopped broker's store through the store plugin (what a bug or an old
    version could have left there)."""
    cfg = Config(data_dir=str(data_dir))
    settings = StoreSettings(data_dir=cfg.data_dir, flush="sync", flush_interval_ms=50,
                             options=cfg.store_settings_options())
    engine = get_plugin_manager().store_engine(cfg.store)(settings)
    try:
        batch = bytearray(b"".join(records))
        engine.messages.append(topic, queue_id, batch, record.scan(batch))
        engine.messages.flush()
    finally:
        engine.close()


def test_a_malformed_record_in_the_schedule_topic_is_quarantined_and_delivery_goes_on(fast_broker):
    fast_broker.stop()
    due = str(int(time.time() * 1000))
    _append_offline(fast_broker.data_dir, "%SCHEDULE%", 0, [
        record.encode_record("%SCHEDULE%", b"no real topic", properties={"DELIVER_AT": due}),
        record.encode_record("%SCHEDULE%", b"bad queue", properties={
            "DELIVER_AT": due, "REAL_TOPIC": "later", "REAL_QUEUE": "not a number"}),
    ])
    fast_broker.start()
    with Producer(fast_broker.address) as p:
        p.send(Message("later", b"good", delay_level=1))  # same waiting queue, after the bad ones
    col = Collector(1)
    c = Consumer("gq", fast_broker.address, consume_from="first", **FAST).subscribe("later")
    c.start(col)
    try:
        assert col.wait(20), "a malformed record stopped delivery of the next one"
    finally:
        c.close()
    with AdminClient(fast_broker.address) as admin:
        assert wait_until(lambda: "%QUARANTINE%" in admin.topics(system=True), 10)
        quarantined = admin.read_queue("%QUARANTINE%", 0, 0, 10)
        stats = admin.broker_info()["scheduler"]
    assert [b for *_, b in col.items] == [b"good"]
    assert len(quarantined) == 2
    reasons = [m.properties["QUARANTINE_REASON"] for m in quarantined]
    assert "no REAL_TOPIC" in reasons[0] and "ValueError" in reasons[1], reasons
    assert [m.properties["QUARANTINE_SOURCE"] for m in quarantined] == ["%SCHEDULE%/0@0", "%SCHEDULE%/0@1"]
    kept = [record.decode(m.body) for m in quarantined]  # the body is the whole original record
    assert [k.body for k in kept] == [b"no real topic", b"bad queue"]
    assert stats["quarantined"] == 2 and stats["progress"]["%SCHEDULE%:0"] == 3
