"""The backup procedure of docs/operations.md: stop the broker, copy its data dir, start a broker
on the copy. Every message and every committed offset must come back, on every store."""

from __future__ import annotations

import shutil

import pytest

from equeue_core.client import AdminClient, Message, Producer
from tests.conftest import installed
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import consume


@pytest.mark.parametrize("store", installed("equeue_store_engines"))
def test_a_copy_of_a_stopped_data_dir_serves_every_message_and_offset(tmp_path, store):
    original = BrokerProcess(tmp_path / "data", store=store).start()
    try:
        with Producer(original.address) as p:
            p.send_batch([Message("orders", f"m{i}".encode(), keys=[f"k{i}"]) for i in range(2000)])
        assert len(consume(original.address, "billing", "orders", 500, pull_batch=16).items) >= 500
        with AdminClient(original.address) as admin:
            before = admin.groups("billing")["billing"]["queues"]
    finally:
        original.stop()  # SIGTERM: flush, persist offsets, clean-shutdown mark
    shutil.copytree(tmp_path / "data", tmp_path / "backup", symlinks=True)
    shutil.rmtree(tmp_path / "data")  # the disaster

    restored = BrokerProcess(tmp_path / "backup", store=store).start()
    try:
        with AdminClient(restored.address) as admin:
            info = admin.broker_info()
            assert info["recovery"]["clean"] is True
            assert sum(hi - lo for lo, hi in admin.queue_ranges("orders")) == 2000
            assert admin.groups("billing")["billing"]["queues"] == before
            assert [m.body for m in admin.find_by_key("orders", "k1999")] == [b"m1999"]
        rest = consume(restored.address, "billing", "orders", 2000 - sum(r["committed"] or 0 for r in before),
                       timeout=60)
        seen = {b for *_, b in rest.items}
        assert len(seen) == 2000 - sum(r["committed"] or 0 for r in before)
    finally:
        restored.stop()
