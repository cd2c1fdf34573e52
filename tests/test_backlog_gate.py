"""The push Consumer's backlog turns by bytes (client/backlog_gate.py): while a blocking handler
only computes, the queues catching up at once hold about `max_backlog_bytes`; once the handlers
are seen to wait, up to `max_backlog_queues` catch up so that every handler thread has work."""

from __future__ import annotations

import asyncio
import time

import pytest

from equeue_core.client import AdminClient, Consumer, LitePullConsumer, Message, Producer
from equeue_core.client.backlog_gate import DEFAULT_MAX_BACKLOG_BYTES, BacklogGate
from equeue_core.errors import ConfigError
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import Collector, consume
from tests.test_lite_pull import _poll_until

KiB = 1024
MiB = 1024 * KiB


def test_the_limit_follows_a_message_s_measured_bytes_and_the_busy_workers():
    busy = [1]
    gate = BacklogGate(16, 4 * MiB, 1000, 100 * MiB, lambda: busy[0])
    assert gate.limit() == 2  # no answer yet: two turns for the one busy worker
    gate.measured(1101 * 500, 500)  # 1 KiB messages: a window of ~1.1 MB, 3 fit in 4 MiB
    assert gate.record_bytes.mean == 1101
    assert gate.limit() == 3
    for _ in range(200):  # 100 B messages: 16 windows are ~2.8 MB, the count bounds it
        gate.measured(177 * 1000, 1000)
    assert gate.limit() == 16
    for _ in range(200):
        gate.measured(64 * KiB * 10, 10)  # 64 KiB messages: flow_max_bytes bounds the window
    assert gate.limit() == 2
    busy[0] = 8  # the handlers wait: every worker that may run gets two queues, within the count
    assert gate.limit() == 16
    assert BacklogGate(16, None, 1000, 100 * MiB, lambda: 1).limit() == 16  # no byte bound
    assert BacklogGate(16, 4 * MiB, 1000, 100 * MiB, None).limit() == 16  # async handler: no pool
    assert BacklogGate(1, 4 * MiB, 1000, 100 * MiB, lambda: 1).limit() == 1  # never above the count


def test_turns_go_in_the_order_asked_and_a_raised_limit_lets_the_line_through():
    async def main() -> None:
        busy = [1]
        gate = BacklogGate(6, 4 * MiB, 1000, 100 * MiB, lambda: busy[0])
        gate.measured(1101, 1)
        order: list[int] = []

        async def queue(i: int) -> None:
            await gate.take()
            order.append(i)

        tasks = [asyncio.create_task(queue(i)) for i in range(8)]
        await asyncio.sleep(0.01)
        assert order == [0, 1, 2] and gate.held == 3
        gate.release()
        await asyncio.sleep(0.01)
        assert order == [0, 1, 2, 3] and gate.held == 3
        busy[0] = 8
        gate.wake_soon()  # the pool let every worker run: the line goes through, up to the count
        await asyncio.sleep(0.01)
        assert order == [0, 1, 2, 3, 4, 5, 6] and gate.held == 6 == gate.peak
        # a queue cancelled while in line is left out, and the turn goes to the next
        late = asyncio.create_task(queue(99))
        await asyncio.sleep(0.01)
        tasks[7].cancel()
        gate.release()
        await asyncio.sleep(0.01)
        assert order[-1] == 99 and gate.held == 6
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, late, return_exceptions=True)

    asyncio.run(main())


def test_a_turn_given_as_its_queue_is_cancelled_goes_on_to_the_next():
    async def main() -> None:
        gate = BacklogGate(1, None, 1000, 100 * MiB, None)
        await gate.take()
        first = asyncio.create_task(gate.take())
        second = asyncio.create_task(gate.take())
        await asyncio.sleep(0.01)
        gate.release()  # given to `first` ...
        first.cancel()  # ... which is cancelled before it ran: the turn passes to `second`
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 2)
        assert gate.held == 1

    asyncio.run(main())


def _backlog(address: str, queues: int, per_queue: int, size: int) -> None:
    with AdminClient(address) as admin:
        admin.create_topic("backlog", queues)
    with Producer(address) as p:  # without a routing key a batch goes to the next queue in turn
        filled = [p.send_batch([Message("backlog", f"{q}-{i}-".encode().ljust(size, b"x"))
                                for i in range(per_queue)])[0].queue_id for q in range(queues)]
    assert sorted(filled) == list(range(queues))


class SleepingCollector(Collector):
    """A Collector whose handler sleeps first (a handler that waits on I/O)."""

    def __init__(self, expected: int, sleep: float) -> None:
        super().__init__(expected)
        self.sleep = sleep

    def __call__(self, m) -> None:
        time.sleep(self.sleep)
        super().__call__(m)


def _drain(address: str, group: str, expected: int, handler_sleep: float = 0.0, **options) -> dict[str, int]:
    col = consume(address, group, "backlog", expected,
                  collector=SleepingCollector(expected, handler_sleep) if handler_sleep else None, **options)
    assert col.done.is_set(), f"got {len(col.items)} of {expected}"
    assert len({item[3] for item in col.items}) == len(col.items)  # none twice
    return col.stats


def test_a_computing_handler_s_backlog_turns_follow_the_bytes_and_a_waiting_one_s_the_queue_count(tmp_path):
    """Messages of 1 KiB with a window of 100 a queue (~110 KB): 256 KiB lets two queues catch up at
    once while the handler only computes. Without the byte bound, up to max_backlog_queues (16) do
    (the measure is real). With a handler that sleeps, the pool lets every thread run and the turns
    go back up to the count, so eight threads each have a queue. The first two drains run one
    handler thread, so that a slow moment of the machine cannot look like a waiting handler."""
    queues, per_queue = 30, 150
    with BrokerProcess(tmp_path / "data") as b:
        _backlog(b.address, queues, per_queue, KiB)
        total = queues * per_queue
        options = {"flow_max_messages": 100, "max_backlog_queues": 16}
        bounded = _drain(b.address, "bounded", total, threads=1, max_backlog_bytes=256 * KiB, **options)
        assert 1 <= bounded["backlog_queues_peak"] <= 2, bounded
        unbounded = _drain(b.address, "unbounded", total, threads=1, max_backlog_bytes=None, **options)
        assert unbounded["backlog_queues_peak"] > 2, unbounded
        waiting = _drain(b.address, "waiting", 600, handler_sleep=0.002, threads=8,
                         max_backlog_bytes=256 * KiB, **options)
        assert waiting["backlog_queues_peak"] > 2, waiting


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4MiB"])
def test_max_backlog_bytes_must_be_a_whole_number_of_at_least_one_or_none(bad):
    with pytest.raises(ConfigError, match="max_backlog_bytes"):
        Consumer("g", "127.0.0.1:1", max_backlog_bytes=bad)
    assert Consumer("g", "127.0.0.1:1", max_backlog_bytes=None)._async.max_backlog_bytes is None
    assert Consumer("g", "127.0.0.1:1")._async.max_backlog_bytes == DEFAULT_MAX_BACKLOG_BYTES
    with pytest.raises(ConfigError, match="max_backlog_bytes"):
        Consumer("g", "127.0.0.1:1", pull_in_handler_threads=True, max_backlog_bytes=MiB)


def _poll_all(address: str, group: str, expected: int, **options) -> dict[str, int]:
    with LitePullConsumer(group, address, consume_from="first", **options) as c:
        c.assign("backlog")
        got = _poll_until(c, expected, timeout=60)
        assert len(got) == expected, f"got {len(got)} of {expected}"
        assert len({m.body for m in got}) == expected  # none twice
        return dict(c.stats)


def test_a_lite_pull_consumer_s_backlog_turns_follow_the_bytes(tmp_path):
    """The same backlog (1 KiB messages, pulls of 100: an answer of ~110 KB): 256 KiB gives two
    turns; without the byte bound up to max_backlog_queues (16) queues catch up at once."""
    queues, per_queue = 30, 150
    with BrokerProcess(tmp_path / "data") as b:
        _backlog(b.address, queues, per_queue, KiB)
        options = {"pull_batch": 100, "max_backlog_queues": 16}
        bounded = _poll_all(b.address, "bounded", queues * per_queue, max_backlog_bytes=256 * KiB, **options)
        assert 1 <= bounded["backlog_queues_peak"] <= 2, bounded
        unbounded = _poll_all(b.address, "unbounded", queues * per_queue, max_backlog_bytes=None, **options)
        assert unbounded["backlog_queues_peak"] > 2, unbounded


def test_a_lite_pull_consumer_s_turns_grow_once_the_first_answer_tells_the_message_size(tmp_path):
    """Before any answer only two queues catch up. The first answer says the messages are small,
    and the queues in line get their turns then, not once a queue with a turn caught up (each of
    these four holds 20 pulls' worth)."""
    with BrokerProcess(tmp_path / "data") as b:
        _backlog(b.address, 4, 2000, 100)
        with LitePullConsumer("g", b.address, consume_from="first", pull_batch=100) as c:
            c.assign("backlog")
            got = 0
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got = len(c.poll(1.0))
            assert got == 100
            assert c.stats["backlog_queues_peak"] == 4, c.stats


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4MiB"])
def test_a_lite_pull_consumer_s_max_backlog_bytes_must_be_a_whole_number_of_at_least_one_or_none(bad):
    with pytest.raises(ConfigError, match="max_backlog_bytes"):
        LitePullConsumer("g", "127.0.0.1:1", max_backlog_bytes=bad)
