"""A corrupt record through a real broker: the pull error names its place, the consumer stops that
queue instead of pulling it forever, and an admin's skip (CLI) lets the rest flow."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from equeue_core import msgid
from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.errors import CorruptRecordError
from tests.helpers.broker import BrokerProcess

from .helpers import flip_byte


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("model", [pytest.param({}, id="loop_pulls"),
                                   pytest.param({"pull_in_handler_threads": True}, id="handler_threads_pull")])
def test_corrupt_record_stops_the_consumer_until_an_admin_skips_it(tmp_path, model):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with AdminClient(broker.address) as admin:
            admin.create_topic("bad", 1)
        with Producer(broker.address) as p:
            sent = [p.send(Message("bad", f"body-{i}".encode())) for i in range(10)]
        broker.stop()
        _h, _p, position = msgid.decode(sent[4].msg_id)
        chunk = tmp_path / "data" / "commitlog" / f"{0:020d}"
        flip_byte(chunk, position + 80)  # a body byte of queue offset 4: "bit rot" while stopped
        broker.start()

        with AdminClient(broker.address) as admin:
            with pytest.raises(CorruptRecordError) as err:
                admin.read_queue("bad", 0, 4, 1)
        assert err.value.details == {"topic": "bad", "queue_id": 0, "offset": 4, "position": position}

        got: list[int] = []
        lock = threading.Lock()

        def handler(m) -> None:
            with lock:
                got.append(m.queue_offset)

        consumer = Consumer("g", broker.address, consume_from="first", hold_ms=200, corrupt_recheck_max=1.0,
                            **model)
        consumer.subscribe("bad").start(handler)
        try:
            assert _wait(lambda: consumer.stats["corrupt"] >= 1 and len(got) >= 4, 30), (got, consumer.stats)
            assert sorted(got) == [0, 1, 2, 3], "the records before the corrupt one are delivered"
            # stopped, not spinning: over a window of a few seconds (a retrying pull loop would
            # send a pull every 0.2-5 s, a spinning one thousands) it sends no pull at all
            pulls = consumer.stats["pulls"]
            time.sleep(3)
            assert consumer.stats["pulls"] == pulls
            assert consumer.stats["corrupt"] == 1
            with lock:
                assert sorted(got) == [0, 1, 2, 3]

            out = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "groups", "skip", "g",
                                  "--topic", "bad", "--queue", "0", "--offset", "4",
                                  "--broker", broker.address], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            line = out.stdout.strip()
            assert "\n" not in line
            assert line.startswith("skipped bad/0 offset 4 for group g (corrupt record at bad/0 offset 4 "
                                   f"(position {position}): crc mismatch)")
            assert line.endswith("the group resumes at offset 5")
            assert _wait(lambda: len(got) >= 9, 30), got
            with lock:
                assert sorted(got) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        finally:
            consumer.close()
        with AdminClient(broker.address) as admin:
            assert admin.skip_record("g", "bad", 0, 4).startswith("nothing skipped: group g is already at offset")
    finally:
        broker.stop()
