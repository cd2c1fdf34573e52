"""Retention through the broker: old and consumed data is released, unconsumed data is kept."""

from __future__ import annotations

import time

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
