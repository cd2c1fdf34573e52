"""A pull answer kept as bytes until a worker hands it out (client/pulled_batch.py), and the
process queue's bookkeeping of such batches (client/process_queue.py): the same messages as
decode_batch, the committed offset never past an unfinished or failed message, and no decoded
message objects waiting in flight for the garbage collector to scan; a queue's when_idle callback
and wait_change."""

from __future__ import annotations

import asyncio
import threading

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.message import ReceivedMessage, decode_batch
from equeue_core.client.process_queue import ProcessQueue
from equeue_core.client.pulled_batch import DECODE_CHUNK, PulledBatch
from equeue_core.errors import CorruptRecordError
from tests.helpers.live import live_messages
from tests.helpers.waiting import wait_until


def _answer(first_offset: int, n: int, step: int = 1) -> bytes:
    """A pull answer's body: n stamped records at queue offsets first_offset, +step, ..."""
    recs = []
    for i in range(n):
        rec = bytearray(Message("t", f"body{i}".encode(), tag="a" if i % 2 else None).encode())
        rec[12:20] = (1000 + i).to_bytes(8, "little")  # commit-log position (the msg id)
        rec[20:28] = (first_offset + i * step).to_bytes(8, "little")  # queue offset
        recs.append(bytes(rec))
    return b"".join(recs)


def test_a_pulled_batch_decodes_in_chunks_the_messages_decode_batch_gives_and_reads_offsets_undecoded():
    body = _answer(40, 150, step=2)
    whole = decode_batch(body, "AB")
    batch = PulledBatch(memoryview(body), "AB")
    assert len(batch) == 150 and batch.nbytes == len(body) and batch.open
    chunks = [m for lo in range(0, 150, DECODE_CHUNK) for m in batch.decode(lo, min(150, lo + DECODE_CHUNK))]
    assert chunks == whole
    assert [batch.offset_at(i) for i in range(150)] == [m.queue_offset for m in whole]


def test_a_malformed_pull_answer_is_refused_when_pulled_not_when_handed_out():
    body = _answer(0, 3)
    with pytest.raises(CorruptRecordError):
        PulledBatch(body[:-1], "AB")
    assert len(PulledBatch(b"", "AB")) == 0 and not PulledBatch(b"", "AB").open


def test_the_committable_offset_stops_at_a_batch_s_first_unfinished_record_and_at_its_failed_ones():
    pq = ProcessQueue("t", 0, 0)
    first, second = PulledBatch(_answer(0, 10), "AB"), PulledBatch(_answer(10, 10), "AB")
    pq.next_offset = 20
    pq.add_batch(first)
    pq.add_batch(second)
    assert (pq.committable(), pq.count, pq.span()) == (0, 20, 20)
    # the second batch finishes first (parallel_per_queue > 1), its record 13 failed
    pq.finish_batch(second, 10, second.decode(3, 4))
    assert (pq.committable(), pq.count) == (0, 11)
    # the first stops handing out after record 5 (stopping): 6.. stay in flight with the batch
    pq.finish_batch(first, 6, first.decode(2, 3))
    assert (pq.committable(), pq.count) == (2, 4 + 1 + 1)
    pq.done(first.decode(2, 3)[0])
    assert pq.committable() == 6
    pq.finish_batch(first, 10)
    assert pq.committable() == 13  # the failed message of the later batch, added earlier
    pq.done(second.decode(3, 4)[0])
    assert (pq.committable(), pq.count, pq.bytes, pq.span()) == (20, 0, 0, 0)


def test_when_idle_runs_once_from_the_call_that_finishes_the_last_message_and_counts_as_a_watch():
    pq = ProcessQueue("t", 0, 0)
    ran: list[str] = []
    pq.when_idle(lambda: ran.append("now"))  # nothing in flight: at once, and no watch left behind
    assert ran == ["now"] and pq.watched == 0
    first, second = PulledBatch(_answer(0, 10), "AB"), PulledBatch(_answer(10, 10), "AB")
    pq.add_batch(first)
    pq.add_batch(second)
    pq.when_idle(lambda: ran.append("replaced"))
    pq.when_idle(lambda: ran.append("idle"))  # replaces the one waiting: still one watch
    assert pq.watched == 1
    pq.finish_batch(first, 10)
    assert ran == ["now"] and pq.watched == 1 and list(pq.batches) == [second]  # freed at once
    pq.finish_batch(second, 10, second.decode(4, 5))  # its record 14 failed: still in flight
    assert ran == ["now"] and pq.count == 1
    pq.done(second.decode(4, 5)[0])
    assert ran == ["now", "idle"] and pq.watched == 0 and not pq.batches
    pq.add_batch(PulledBatch(_answer(20, 3), "AB"))
    pq.when_idle(lambda: ran.append("cancelled"))
    pq.when_idle(None)
    assert pq.watched == 0
    pq.finish_batch(pq.batches[0], 3)
    assert ran == ["now", "idle"]


def test_wait_change_ends_at_a_wake_or_its_timeout_and_leaves_no_waiter_when_cancelled():
    async def scenario() -> None:
        pq = ProcessQueue("t", 0, 0)
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(pq.wait_change(30))
        await asyncio.sleep(0)
        assert pq.watched == 1
        loop.call_soon(pq.wake)
        await asyncio.wait_for(waiting, 5)
        assert pq.watched == 0
        started = loop.time()
        await pq.wait_change(0.05)  # nobody wakes it
        assert loop.time() - started >= 0.04 and pq.watched == 0 and not pq._waiters
        await asyncio.wait_for(pq.wait_change(30, pq.wake), 5)  # a change made by `collect` ends it at once
        cancelled = asyncio.ensure_future(pq.wait_change(30))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert pq.watched == 0 and not pq._waiters

    asyncio.run(scenario())


@pytest.mark.parametrize("expression", ["*", "a"])
def test_messages_waiting_in_flight_are_not_objects_the_garbage_collector_scans(file_broker, expression):
    """Decoded at pull time, every message waiting for a handler thread (up to flow_max_messages
    per queue) was a live object that each young-generation collection scanned and promoted: the
    largest cost of consuming. Waiting messages stay bytes; a worker decodes a chunk at a time.
    With a tag filter ("a": every other message) the answer was decoded whole at the pull to
    filter it (a filtered drain ran at 0.6x an unfiltered one, in ~500 collections); the filter
    now applies as each chunk is decoded."""
    topic = f"waiting-{'all' if expression == '*' else 'tags'}"
    with AdminClient(file_broker.address) as admin:
        admin.create_topic(topic, 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message(topic, b"x" * 100, tag="ab"[i % 2]) for i in range(1000)])
    release = threading.Event()
    seen: list[int] = []

    def handler(m: ReceivedMessage) -> None:
        release.wait(30)
        seen.append(m.queue_offset)

    c = Consumer(f"g{topic}", file_broker.address, consume_from="first", threads=1)
    c.subscribe(topic, expression)
    c.start(handler)
    try:
        assert wait_until(lambda: sum(pq.count for pq in c._async.queues.values()) >= 400, timeout=30)
        live = live_messages(topic)
        in_flight = sum(pq.count for pq in c._async.queues.values())
        assert live <= DECODE_CHUNK, f"{live} decoded messages alive for {in_flight} in flight"
        release.set()
        want = list(range(1000)) if expression == "*" else list(range(0, 1000, 2))
        assert wait_until(lambda: len(seen) >= len(want), timeout=30)
    finally:
        release.set()
        c.close()
    assert seen == want


@pytest.mark.parametrize("fail_at", [None, 101])
def test_records_the_consumer_s_tag_filter_drops_are_finished_without_the_handler_nor_counted(fail_at):
    """The broker filters pulls by a 64-bit tag hash, so the consumer's exact check drops a record
    only on a collision; when it does, the worker's chunk runs the handler over the rest alone,
    the dropped ones count as finished (the batch can end and be committed), and the pool does not
    count them as handled. A failure among the kept ones stays a failure at its own place."""
    from equeue_core.client.consumer import AsyncConsumer
    from equeue_core.client.handler_pool import HandlerPool

    async def main():
        seen: list[int] = []

        def handler(m: ReceivedMessage) -> None:
            seen.append(m.queue_offset)
            if m.queue_offset == fail_at:
                raise ValueError("fails")

        consumer = AsyncConsumer("gtagdrop", "127.0.0.1:1")
        consumer._handler = handler
        done: list = []
        counted: list[int] = []
        pool = HandlerPool(1, 1, consumer._run_chunk, done.append, asyncio.get_running_loop(), "tagdrop",
                           counted.append)
        batch = PulledBatch(_answer(0, 200), "AB", frozenset({"a"}))  # odd offsets are tagged "a"
        pq = ProcessQueue("t", 0, 0)
        pq.add_batch(batch)
        pool.submit(pq, batch)
        assert await pool.wait_idle(10)
        pool.shutdown(wait=True)
        return seen, done, counted

    seen, done, counted = asyncio.run(main())
    assert seen == list(range(1, 200, 2))
    (run,) = done
    assert run.skipped == 100
    assert [i for i, ok in enumerate(run.results) if ok is not True] == ([] if fail_at is None else [fail_at])
    assert sum(counted) == (100 if fail_at is None else 99)


@pytest.mark.parametrize("fail_at", [None, 101])
def test_an_async_handler_s_answer_is_tag_filtered_chunk_by_chunk_and_the_dropped_are_finished_not_counted(fail_at):
    """An async handler with a tag filter: the answer stays bytes and the exact tag check runs as
    each chunk is decoded, as on the workers (it decoded the whole answer at the pull to filter
    it). The dropped records' results are True (finished), the kept ones' their own, and the
    consumer's handled count leaves the dropped out."""
    from equeue_core.client.consumer import AsyncConsumer

    async def main():
        seen: list[int] = []
        live: list[int] = []

        async def handler(m: ReceivedMessage) -> None:
            seen.append(m.queue_offset)
            if m.queue_offset == 151:
                live.append(live_messages("t"))
            if m.queue_offset == fail_at:
                raise ValueError("fails")

        consumer = AsyncConsumer("gasynctagdrop", "127.0.0.1:1")
        consumer._handler = handler
        consumer._is_async = True
        batch = PulledBatch(_answer(0, 200), "AB", frozenset({"a"}))  # odd offsets are tagged "a"
        results = await consumer._handle(batch)
        if fail_at is None:  # (a failure would go back to a broker: none here)
            consumer._handing_out = True
            pq = ProcessQueue("t", 0, 0)
            pq.add_batch(batch)
            pq.next_offset = 200
            await consumer._consume(pq, PulledBatch(_answer(0, 200), "AB", frozenset({"a"})))
        return seen, live, results, batch, dict(consumer.stats)

    seen, live, results, batch, stats = asyncio.run(main())
    assert seen[:100] == list(range(1, 200, 2))
    assert live[0] <= DECODE_CHUNK, f"{live[0]} decoded messages alive inside the answer"
    assert batch.dropped == 100
    assert [i for i, ok in enumerate(results) if ok is not True] == ([] if fail_at is None else [fail_at])
    if fail_at is None:
        assert stats["handled"] == 100


def test_pulling_handler_threads_tag_filter_an_answer_chunk_by_chunk_and_count_only_the_kept():
    """A pulling handler thread's batch with a tag filter (LitePullConsumer._poll_batch keeps it
    bytes now): the handler gets only the kept records, a failure among them comes back as that
    message, and the thread's handled count leaves the dropped out."""
    from equeue_core.client.pulling_handlers import PullingHandlerConsumer

    seen: list[int] = []

    def handler(m: ReceivedMessage) -> None:
        seen.append(m.queue_offset)
        if m.queue_offset == 101:
            raise ValueError("fails")

    c = PullingHandlerConsumer("gpulltagdrop", "127.0.0.1:1", threads=1)
    try:
        c._handler = handler
        failed = c._run_batch(PulledBatch(_answer(0, 200), "AB", frozenset({"a"})), lambda: True)
        assert seen == list(range(1, 200, 2))
        assert [m.queue_offset for m in failed] == [101]
        stopped = c._run_batch(PulledBatch(_answer(0, 200), "AB", frozenset({"a"})), lambda: len(seen) < 120)
        assert stopped is None and len(seen) == 120  # keep_going said stop: the rest is not run
    finally:
        c.close()


def test_an_orderly_consumer_decodes_pending_a_part_at_a_time_and_its_tag_filter_finishes_the_dropped():
    """The orderly loop takes a pulled answer's messages into pending 256 at a time; with a tag
    filter the records it drops (odd offsets are tagged "a", even ones have none) are finished on
    the spot, the kept ones are in flight one by one, so the committable offset waits for the
    first kept one and reaches the answer's end once they are done."""
    from equeue_core.client.consumer import AsyncConsumer

    consumer = AsyncConsumer("gorderlytags", "127.0.0.1:1", orderly=True)
    pq = ProcessQueue("t", 0, 0)
    pq.add_batch(PulledBatch(_answer(0, 600), "AB", frozenset({"a"})))
    pq.next_offset = 600
    consumer._decode_pending(pq)
    first = [m.queue_offset for m in pq.pending]
    assert first == list(range(1, 512, 2)) and len(pq.in_flight) == 256
    assert pq.committable() == 1
    done = list(pq.pending)
    pq.pending.clear()
    pq.done_many(done)
    consumer._decode_pending(pq)
    assert [m.queue_offset for m in pq.pending] == list(range(513, 600, 2)) and not pq.batches
    pq.done_many(list(pq.pending))
    assert pq.committable() == 600


@pytest.mark.parametrize("expression", ["*", "a"])
def test_pulling_handler_threads_decode_an_answer_a_chunk_at_a_time(file_broker, expression):
    """With pull_in_handler_threads the thread that pulls an answer hands it out itself. It used
    to decode the whole answer (hundreds of messages) before the first call, all of them alive
    while the handler went through them; a drain spent 42 % of those threads' samples on that
    line. Now a chunk at a time, as the default Consumer's workers do: while the handler is in
    the batch, at most a chunk of it exists as objects. With a tag filter too (every message is
    tagged "a"), which used to decode the whole answer to filter it."""
    topic = "chunked" if expression == "*" else "chunkedtags"
    with AdminClient(file_broker.address) as admin:
        admin.create_topic(topic, 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message(topic, b"x" * 100, tag="a") for _ in range(600)])
    inside = threading.Event()
    release = threading.Event()
    seen: list[int] = []

    def handler(m: ReceivedMessage) -> None:
        seen.append(m.queue_offset)
        if m.queue_offset == 5:
            inside.set()
            release.wait(30)

    c = Consumer(f"g{topic}", file_broker.address, consume_from="first", pull_in_handler_threads=True, threads=1)
    c.subscribe(topic, expression)
    c.start(handler)
    try:
        assert inside.wait(30)
        live = live_messages(topic)
        assert live <= DECODE_CHUNK, f"{live} decoded messages alive while the handler is in the batch"
        release.set()
        assert wait_until(lambda: len(seen) >= 600, timeout=30)
    finally:
        release.set()
        c.close()
    assert seen == list(range(600)), "not every message once and in offset order"
