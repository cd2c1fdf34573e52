"""Retention through the broker: old and consumed data is released, unconsumed data is kept."""

from __future__ import annotations

import time

from equeue_core import record
from equeue_core.client import AdminClient, Message, Producer
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import consume


def _broker(tmp_path, policy: str) -> BrokerProcess:
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'retention_hours = 0.0002\nretention_policy = "{policy}"\nretention_check_s = 0.3\n'
                   "offset_persist_ms = 200\nmax_frame_size = 65000\nmax_body_size = 16384\n[store_options.file]\nchunk_size = 65536\n")
    return BrokerProcess(tmp_path / "data", config=str(cfg)).start()


def _lowest(address: str, topic: str) -> int:
    with AdminClient(address) as admin:
        return max(lo for lo, _hi in admin.queue_ranges(topic))


def test_old_consumed_chunks_are_released_and_consumers_move_on(tmp_path):
    b = _broker(tmp_path, "time_and_consumed")
    try:
        with Producer(b.address) as p:
            for _ in range(30):  # batches well under the small chunk size
                p.send_batch([Message("ret", b"x" * 200) for _ in range(100)], routing_key="k")
        assert len(consume(b.address, "g", "ret", 3000).items) == 3000
        deadline = time.monotonic() + 20
        while _lowest(b.address, "ret") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        low = _lowest(b.address, "ret")
        assert low > 0, "nothing was released"
        late = consume(b.address, "late-group", "ret", 3000 - low, timeout=20)
        assert len(late.items) == 3000 - low  # a new group starts at the new minimum
    finally:
        b.stop()


def test_unconsumed_data_is_kept_under_time_and_consumed(tmp_path):
    b = _broker(tmp_path, "time_and_consumed")
    try:
        with Producer(b.address) as p:
            for _ in range(30):
                p.send_batch([Message("keep", b"x" * 200) for _ in range(100)], routing_key="k")
        time.sleep(2.5)
        assert _lowest(b.address, "keep") == 0
    finally:
        b.stop()


def test_above_the_disk_high_water_mark_the_oldest_data_goes_even_unconsumed(tmp_path):
    cfg = tmp_path / "b.toml"
    cfg.write_text("retention_hours = 1000\nretention_check_s = 0.3\nmax_frame_size = 65000\nmax_body_size = 16384\n[store_options.file]\nchunk_size = 65536\n")
    b = BrokerProcess(tmp_path / "data", config=str(cfg), env={"EQUEUE_DISK_HIGH_WATER": "0.0001"}).start()
    try:
        with Producer(b.address) as p:
            for _batch in range(30):
                p.send_batch([Message("full", b"x" * 200) for _ in range(100)], routing_key="k")
                time.sleep(0.03)  # spread the data over time: "oldest" must mean something
        deadline = time.monotonic() + 20
        while _lowest(b.address, "full") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _lowest(b.address, "full") > 0, "nothing released above the high-water mark"
    finally:
        b.stop()
    assert "FULL (high-water mark" in b.log_path.read_text()


def _lmdb_with_old_data(tmp_path) -> tuple[str, str]:
    """An LMDB data dir holding 4000 messages in small chunks, written by a broker since stopped."""
    cfg = tmp_path / "b.toml"
    cfg.write_text("retention_hours = 1000\nretention_check_s = 0.3\n[store_options.lmdb]\nchunk_bytes = 16384\n")
    b = BrokerProcess(tmp_path / "data", store="lmdb", config=str(cfg)).start()
    try:
        with Producer(b.address) as p:
            for _batch in range(40):
                p.send_batch([Message("full", b"x" * 500) for _ in range(100)], routing_key="k")
    finally:
        b.stop()
    return str(tmp_path / "data"), str(cfg)


def test_lmdb_disk_relief_releases_once_not_on_every_check(tmp_path):
    """LMDB's file never shrinks, so the disk stays above the mark after a relief round; the
    freed pages are what the next writes go into. On main every check released another tenth."""
    data, cfg = _lmdb_with_old_data(tmp_path)
    b = BrokerProcess(data, store="lmdb", config=cfg, env={"EQUEUE_DISK_HIGH_WATER": "0.0001"}).start()
    try:
        deadline = time.monotonic() + 30
        while _lowest(b.address, "full") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        first = _lowest(b.address, "full")
        assert 0 < first < 4000, "the first relief round released nothing (or everything)"
        skipped = "nothing more released"
        deadline = time.monotonic() + 30
        while b.log_path.read_text().count(skipped) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert b.log_path.read_text().count(skipped) >= 5, "fewer than 5 later checks ran"
        assert _lowest(b.address, "full") == first, "a later check released more"
    finally:
        b.stop()
    assert b.log_path.read_text().count("FULL (high-water mark") == 1


async def _broker_with_old_data(data_dir):
    """An in-process broker (its retention timer off) holding 4 MB that retention may release."""
    from equeue_core.broker.broker import Broker
    from equeue_core.config import load
    from tests.helpers.broker import free_port

    broker = Broker(load(overrides={"data_dir": str(data_dir), "port": free_port(),
                                    "retention_hours": 0, "retention_check_s": 3600,
                                    "retention_policy": "time", "max_frame_size": 65000,
                                    "max_body_size": 16384,
                                    "store_options": {"file": {"chunk_size": 65536}}}))
    await broker.start()
    for _ in range(200):
        batch = bytearray(b"".join(record.encode_record("old", b"x" * 2000) for _ in range(10)))
        broker.append("old", 0, batch, record.scan(batch))
    return broker


def test_retention_round_runs_beside_the_event_loop(tmp_path):
    """A round's searches and deletes run on a worker thread: the broker's loop keeps running
    other tasks meanwhile (on main the round ran on the loop and nothing else could run)."""
    import asyncio

    async def scenario() -> tuple[int, int]:
        broker = await _broker_with_old_data(tmp_path / "data")
        try:
            ticks = 0
            running = True

            async def ticker() -> None:
                nonlocal ticks
                while running:
                    ticks += 1
                    await asyncio.sleep(0)

            task = asyncio.create_task(ticker())
            released = await broker.retention.run_once()
            during = ticks
            running = False
            await task
            return released, during
        finally:
            await broker.stop()

    released, ticks_during_round = asyncio.run(scenario())
    assert released > 0, "the round had nothing to do: the test proves nothing"
    assert ticks_during_round > 0, "the event loop ran nothing while retention worked"


def test_stopping_the_broker_waits_for_a_retention_round_in_its_thread(tmp_path):
    """Cancelling a round (what Broker.stop does to its tasks) must not leave its thread deleting
    in a store that is then closed: run_once returns only after the round ended."""
    import asyncio

    async def scenario() -> int:
        broker = await _broker_with_old_data(tmp_path / "data")
        try:
            task = asyncio.create_task(broker.retention.run_once())
            for _ in range(3):
                await asyncio.sleep(0)  # the round is on its thread now
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return broker.retention.released  # counted at the end of the round
        finally:
            await broker.stop()

    assert asyncio.run(scenario()) > 0, "the cancelled round was still running when run_once returned"
