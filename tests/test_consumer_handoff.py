"""How a concurrent consumer hands pulled batches to its blocking handler (client/handler_pool.py)
and keeps pulling meanwhile: per-queue order, no batch lost or run twice, a stuck batch freed at
consume_timeout, and the next pull in flight while a full batch is handled."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.consumer import run_handler
from equeue_core.client.handler_pool import BatchRun, HandlerPool
from equeue_core.client.process_queue import ProcessQueue
from equeue_core.errors import ConfigError
from tests.helpers.waiting import wait_until, wait_until_async


def _msgs(topic: str, first: int, n: int) -> list:
    from equeue_core.client.message import ReceivedMessage

    return [ReceivedMessage(topic, 0, off, f"id{off}", None, (), {}, b"x", 0, 0) for off in range(first, first + n)]


def _run_chunk_with(handler):
    def run_chunk(msgs, results, stop_on_failure, keep_going, halt):  # as the consumer's, one message a call
        run_handler(handler, 1, msgs, results, 0, stop_on_failure, keep_going, halt)
    return run_chunk


async def _pool(handler, threads: int = 4, parallel: int = 1, **options):
    """A pool on the running loop, and the list of its finished batches; `options`: the pool's
    busy-limit thresholds (min_busy, block_min_s, rescue_s, calm_s)."""
    done: list[BatchRun] = []

    def on_done(run: BatchRun) -> None:  # as the consumer does: the window moves, waiters wake
        done.append(run)
        run.pq.done_many([m for m, ok in zip(run.msgs, run.results, strict=True) if ok])

    pool = HandlerPool(threads, parallel, _run_chunk_with(handler), on_done,
                       asyncio.get_running_loop(), "test-pool", **options)
    return pool, done


def test_one_queues_batches_reach_the_handler_in_offset_order_one_at_a_time_while_queues_run_in_parallel():
    async def main():
        seen: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        active: dict[str, int] = {"a": 0, "b": 0, "c": 0}
        overlap: list[str] = []
        threads_seen: set[str] = set()
        lock = threading.Lock()

        def handler(m):
            with lock:
                active[m.topic] += 1
                if active[m.topic] > 1:
                    overlap.append(m.topic)
                threads_seen.add(threading.current_thread().name)
            time.sleep(0.0005)
            with lock:
                seen[m.topic].append(m.queue_offset)
                active[m.topic] -= 1

        pool, done = await _pool(handler)
        queues = {t: ProcessQueue(t, 0, 0) for t in seen}
        for k in range(20):  # 20 batches of 10 per queue, submitted while earlier ones run
            for t, pq in queues.items():
                pool.submit(pq, _msgs(t, k * 10, 10))
            await asyncio.sleep(0)
        assert await pool.wait_idle(30)
        pool.shutdown(wait=True)
        return seen, overlap, done, threads_seen

    seen, overlap, done, threads_seen = asyncio.run(main())
    assert overlap == []  # never two batches of one queue at once
    for t, offsets in seen.items():
        assert offsets == list(range(200)), t  # every message once, in offset order
    assert len(done) == 60 and all(all(r is True for r in run.results) for run in done)
    assert len(threads_seen) > 1  # different queues did run on different threads


def test_a_batch_past_consume_timeout_counts_as_failed_and_its_queue_goes_on_on_another_thread():
    async def main():
        release = threading.Event()
        calls: list[tuple[int, str]] = []

        def handler(m):
            calls.append((m.queue_offset, threading.current_thread().name))
            if m.queue_offset == 0:
                release.wait(20)  # stuck far past the timeout

        pool, done = await _pool(handler)
        pq = ProcessQueue("t", 0, 0)
        pool.submit(pq, _msgs("t", 0, 3))
        pool.submit(pq, _msgs("t", 3, 2))
        await asyncio.sleep(0.3)
        assert [c[0] for c in calls] == [0]  # the second batch waits behind the stuck one
        assert pool.expire(0.2) == 1
        expired = list(done)
        for _ in range(200):
            pool.collect()
            if len(done) == 2:
                break
            await asyncio.sleep(0.05)
        release.set()
        assert await pool.wait_idle(30)
        await asyncio.sleep(0.1)
        pool.shutdown(wait=True)
        return expired, done, calls

    expired, done, calls = asyncio.run(main())
    assert len(expired) == 1 and expired[0].results == [False, False, False]  # unfinished: failed
    assert len(done) == 2 and done[1].results == [True, True]  # reported once; the queue went on
    assert [c[0] for c in calls] == [0, 3, 4]  # the expired batch handed out nothing more
    assert calls[0][1] != calls[1][1]  # on another thread while the first was stuck


def test_a_finished_batch_wakes_the_loop_only_for_a_queue_someone_waits_on():
    """A batch handled without failure is collected at the loop's next look (no wake-up of its
    own), except while the queue's pull loop waits for room: then its finishing ends the wait."""
    async def main():
        gate = threading.Event()

        def handler(m):
            gate.wait(20)

        pool, done = await _pool(handler)
        pq = ProcessQueue("t", 0, 0)
        pq.add(_msgs("t", 0, 2))
        gate.set()
        pool.submit(pq, _msgs("t", 0, 1))
        for _ in range(100):  # the batch finishes; nobody watches pq, so nobody is woken
            await asyncio.sleep(0.02)
            if not pool.busy:
                break
        await asyncio.sleep(0.1)
        quiet = len(done)
        pool.collect()
        collected = len(done)
        gate.clear()
        pool.submit(pq, _msgs("t", 1, 1))
        waiter = asyncio.ensure_future(pq.wait_change(60, pool.collect))
        await asyncio.sleep(0.05)
        gate.set()  # its finishing must end the wait, not the 60 s safety net
        await asyncio.wait_for(waiter, 20)
        pool.shutdown(wait=True)
        return quiet, collected, len(done)

    quiet, collected, after_wait = asyncio.run(main())
    assert (quiet, collected, after_wait) == (0, 1, 2)


def test_no_batch_is_started_once_handing_out_stopped():
    async def main():
        first = threading.Event()
        release = threading.Event()
        calls: list[int] = []

        def handler(m):
            calls.append(m.queue_offset)
            first.set()
            release.wait(20)

        pool, done = await _pool(handler)
        pq = ProcessQueue("t", 0, 0)
        pool.submit(pq, _msgs("t", 0, 2))
        pool.submit(pq, _msgs("t", 2, 2))
        for _ in range(200):
            if first.is_set():
                break
            await asyncio.sleep(0.05)
        pool.halt()
        release.set()
        assert await pool.wait_idle(30)
        pool.shutdown(wait=True)
        return calls, done

    calls, done = asyncio.run(main())
    assert calls == [0]  # the call in progress finished; nothing more was handed out
    assert len(done) == 1 and done[0].results == [True, None]


def test_stop_handling_in_a_handler_hands_out_nothing_after_the_call_in_progress(file_broker):
    """The default push Consumer's workers read their batch's halt flag before each message:
    stop_handling() called by the handler at offset 9 of a 30-message batch leaves 10..29
    unhandled and uncommitted (the group gets them again). A worker that never looked at the flag
    inside a batch handed out all 30."""
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("halt", 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message("halt", b"%d" % i) for i in range(30)])  # one pull brings all 30
    seen: list[int] = []

    def stopping(m) -> None:
        seen.append(m.queue_offset)
        if m.queue_offset == 9:
            c.stop_handling()

    c = Consumer("halt-g", file_broker.address, consume_from="first").subscribe("halt")
    c.start(stopping)
    try:
        assert wait_until(lambda: 9 in seen, 20)
        time.sleep(0.5)  # time to hand out more, were it going to
    finally:
        c.close()
    assert seen == list(range(10)), "a message was handed out after stop_handling()"
    again: list[int] = []
    c2 = Consumer("halt-g", file_broker.address, consume_from="first").subscribe("halt")
    c2.start(lambda m: again.append(m.queue_offset))
    try:
        assert wait_until(lambda: 29 in again, 20)
    finally:
        c2.close()
    assert set(again) >= set(range(10, 30)), "unhandled messages were committed"


def test_the_next_pull_is_in_flight_while_a_full_batch_is_handled(file_broker):
    """With the adaptive batch at its ceiling equal to flow_max_messages, one pull filled the
    whole window: the pull loop waited until the handler had finished that batch, so pulling and
    handling took turns. The ceiling is half the window now: a pull is in flight meanwhile."""
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("window", 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message("window", b"w" * 10) for _ in range(500)])
    seen_pulls: list[int] = []
    c = Consumer("window-g", file_broker.address, consume_from="first", flow_max_messages=32,
                 hold_ms=200).subscribe("window")

    def handler(m) -> None:
        if m.queue_offset == 0:  # hold the first batch until another pull went out (bounded)
            wait_until(lambda: c.stats["pulls"] >= 2, timeout=5, interval=0.01)
            seen_pulls.append(c.stats["pulls"])

    c.start(handler)
    try:
        assert wait_until(lambda: c.stats["handled"] >= 500, timeout=60)
    finally:
        c.close()
    assert seen_pulls and seen_pulls[0] >= 2
    assert c.stats["pull_batch_peak"] <= 16


def test_close_does_not_hang_on_a_handler_stuck_past_consume_timeout(file_broker):
    """A handler stuck past consume_timeout: its messages count as failed (sent back) and close()
    gives it drain_timeout, then returns and leaves the stuck thread behind. Before, close()
    joined the worker threads without a limit and hung for as long as the handler was stuck."""
    with Producer(file_broker.address) as p:
        p.send(Message("stuck", b"s"))
    release = threading.Event()
    calls: list[int] = []

    def handler(m) -> None:
        calls.append(m.reconsume_times)
        if m.reconsume_times == 0:
            release.wait(60)

    c = Consumer("stuck-g", file_broker.address, consume_from="first", consume_timeout=0.3,
                 suspend_seconds=0.1, heartbeat_interval=0.5, rebalance_interval=1.0).subscribe("stuck")
    c.start(handler)
    closer = threading.Thread(target=lambda: run_close(c))
    try:
        assert wait_until(lambda: c.stats["failed"] >= 1, 30), c.stats
        # close() must not wait for the stuck handler beyond its drain timeout
        closer.start()
        closer.join(45)
        assert not closer.is_alive()
    finally:
        release.set()
        if closer.ident is None:
            closer.start()
        closer.join(60)


def run_close(c: Consumer) -> None:
    from equeue_core.client.loop import run_sync

    run_sync(c._async.close(drain_timeout=1.0))


def test_at_a_paced_rate_batches_go_to_the_thread_that_went_idle_last_not_round_the_whole_pool():
    """Before: an idle pool's threads all waited on one queue and each batch woke whichever had
    waited longest, so a paced stream rotated over every thread the pool had ever started (each
    wake-up a cold thread: the submit-to-handler p99 at 5k msg/s was 1.5-2.2 ms with 4-8 threads,
    0.4-0.6 ms with one). Now the worker that went idle last takes the next queue."""
    async def main():
        release = threading.Event()
        names: list[str] = []
        handled = threading.Semaphore(0)

        def handler(m):
            if m.topic.startswith("burst"):
                release.wait(10)  # the burst: four threads busy at once, so four are started
            names.append(threading.current_thread().name)
            handled.release()

        pool, done = await _pool(handler, threads=8)
        burst = [ProcessQueue(f"burst{i}", 0, 0) for i in range(4)]
        for pq in burst:
            pool.submit(pq, _msgs(pq.topic, 0, 1))
        await asyncio.sleep(0.05)
        release.set()
        assert await pool.wait_idle(30)
        started = set(names)
        assert len(started) == 4, started  # four threads exist and are idle now
        names.clear()
        paced = [ProcessQueue(f"paced{i}", 0, 0) for i in range(4)]
        for k in range(40):  # one message at a time, each handled before the next is submitted
            pq = paced[k % 4]
            pool.submit(pq, _msgs(pq.topic, k // 4, 1))
            deadline = time.monotonic() + 10
            while not handled.acquire(blocking=False):
                assert time.monotonic() < deadline, "a batch was not handled within 10 s"
                await asyncio.sleep(0.001)
            # its worker goes back to sleep (on a loaded machine that took over 2 ms, and a
            # batch given while it was still awake went to the one idle before it)
            while pool.idle_workers < len(started):
                assert time.monotonic() < deadline, "a worker did not go back to sleep within 10 s"
                await asyncio.sleep(0.001)
        assert await pool.wait_idle(30)
        pool.shutdown(wait=True)
        return names

    names = asyncio.run(main())
    assert len(names) == 40
    assert len(set(names)) == 1, f"40 paced batches ran on {len(set(names))} threads: {sorted(set(names))}"


def test_a_sleeping_worker_is_woken_at_the_end_of_the_loop_turn_that_gave_it_a_batch():
    """The doorbell rings when the loop thread's turn ends, not in submit(): a worker woken
    earlier would find the GIL held by the rest of the turn and sleep again (docs/benchmarks.md,
    "The push Consumer's doorbell at the end of the turn"). The turn here sleeps 50 ms after
    submit, the GIL free all along: the handler must not start before it ends."""
    async def main():
        started: list[float] = []
        pool, _done = await _pool(lambda m: started.append(time.monotonic()), threads=1)
        pq = ProcessQueue("t", 0, 0)
        pool.submit(pq, _msgs("t", 0, 1))  # starts the thread
        await wait_until_async(lambda: len(started) == 1 and pool.idle_workers == 1)
        pool.submit(pq, _msgs("t", 1, 1))
        time.sleep(0.05)  # still the same turn
        turn_ended = time.monotonic()
        assert await pool.wait_idle(10)
        pool.shutdown(wait=True)
        return started, turn_ended

    started, turn_ended = asyncio.run(main())
    assert len(started) == 2
    assert started[1] >= turn_ended


def test_shutdown_in_the_turn_that_gave_a_sleeping_worker_a_batch_still_ends_that_worker():
    """shutdown(wait=True) joins the threads; a worker given a batch in the same turn has not been
    rung yet and must be, or the join waits for ever."""
    async def main():
        ran: list[int] = []
        pool, _done = await _pool(lambda m: ran.append(m.queue_offset), threads=1)
        pq = ProcessQueue("t", 0, 0)
        pool.submit(pq, _msgs("t", 0, 1))
        await wait_until_async(lambda: ran == [0] and pool.idle_workers == 1)
        pool.submit(pq, _msgs("t", 1, 1))
        joined = threading.Event()
        closer = threading.Thread(target=lambda: (pool.shutdown(wait=True), joined.set()), daemon=True)
        closer.start()  # as close() from the loop thread would, without ending this turn first
        closer.join(10)
        return joined.is_set(), pool

    joined, pool = asyncio.run(main())
    assert joined, "shutdown() never returned: the worker given a batch was never rung"


def _submit_rounds(pool, queues: dict, rounds: int, size: int):
    """`rounds` batches of `size` to every queue, a loop turn between rounds (earlier ones run meanwhile)."""
    async def go():
        for k in range(rounds):
            for t, pq in queues.items():
                pool.submit(pq, _msgs(t, k * size, size))
            await asyncio.sleep(0)
    return go()


def test_a_handler_that_only_computes_keeps_one_worker_busy_and_the_other_queues_wait_in_line():
    """A second worker beside a handler that holds the GIL adds hand-offs, not speed (draining 4
    queues: 1.76 M msg/s with four workers, 2.01 M with one). With no sign of a waiting handler
    (the thresholds set out of reach here) one worker runs every queue's batches, taking them from
    the line in turn, each queue's still in offset order."""
    async def main():
        seen: dict[str, list[int]] = {t: [] for t in "abcd"}
        state = {"active": 0, "peak": 0}
        threads_seen: set[str] = set()
        lock = threading.Lock()

        def handler(m):
            with lock:
                state["active"] += 1
                state["peak"] = max(state["peak"], state["active"])
                threads_seen.add(threading.current_thread().name)
            sum(range(200))  # computes, never waits
            with lock:
                seen[m.topic].append(m.queue_offset)
                state["active"] -= 1

        pool, done = await _pool(handler, block_min_s=60, rescue_s=60)
        queues = {t: ProcessQueue(t, 0, 0) for t in seen}
        await _submit_rounds(pool, queues, 20, 10)
        assert await pool.wait_idle(30)
        limit = pool.busy_limit
        pool.shutdown(wait=True)
        return seen, state["peak"], threads_seen, done, limit

    seen, peak, threads_seen, done, limit = asyncio.run(main())
    for t, offsets in seen.items():
        assert offsets == list(range(200)), t
    assert len(done) == 80
    assert peak == 1 and len(threads_seen) == 1, (peak, threads_seen)
    assert limit == 1


def test_handlers_that_wait_get_every_thread_after_two_batches_that_waited():
    """Batches whose handler sleeps (the process idle meanwhile): after two in a row the pool lets
    every thread work, and the queues in line are taken at once. The consumer is told once (its
    backlog turns follow the busy limit: client/backlog_gate.py)."""
    raised: list[str] = []

    async def main():
        state = {"active": 0, "peak": 0}
        lock = threading.Lock()

        def handler(m):
            with lock:
                state["active"] += 1
                state["peak"] = max(state["peak"], state["active"])
            time.sleep(0.01)
            with lock:
                state["active"] -= 1

        pool, done = await _pool(handler, rescue_s=60,
                                 on_busy_limit_raised=lambda: raised.append(threading.current_thread().name))
        assert pool.busy_limit == 1
        queues = {t: ProcessQueue(t, 0, 0) for t in "abcdefgh"}
        await _submit_rounds(pool, queues, 2, 3)
        assert await pool.wait_idle(30)
        limit = pool.busy_limit
        pool.shutdown(wait=True)
        return state["peak"], done, limit

    peak, done, limit = asyncio.run(main())
    assert len(done) == 16
    assert limit == 4
    assert peak == 4, peak
    assert len(raised) == 1 and raised[0].startswith("test-pool"), raised  # a worker saw it


def test_a_handler_call_that_does_not_return_soon_lets_another_worker_take_the_line():
    """A handler stuck in one call shows nothing until it returns, so the line is watched: queues
    in line while no batch finished for `rescue_s` go to other workers."""
    async def main():
        release = threading.Event()
        handled: list[str] = []

        def handler(m):
            if m.topic == "stuck":
                release.wait(20)
            handled.append(m.topic)

        pool, done = await _pool(handler, block_min_s=60, rescue_s=0.02)
        pool.submit(ProcessQueue("stuck", 0, 0), _msgs("stuck", 0, 1))
        await asyncio.sleep(0.05)  # its worker is in the handler now
        pool.submit(ProcessQueue("other", 0, 0), _msgs("other", 0, 1))
        await wait_until_async(lambda: handled == ["other"], timeout=10)
        limit = pool.busy_limit
        release.set()
        assert await pool.wait_idle(30)
        pool.shutdown(wait=True)
        return handled, limit

    handled, limit = asyncio.run(main())
    assert handled == ["other", "stuck"]
    assert limit == 4


def test_back_to_one_busy_worker_once_the_handlers_stop_waiting_for_calm_s():
    """Handlers that waited, then only compute: a worker going idle `calm_s` after the last sign
    of waiting takes the pool back to one busy worker."""
    async def main():
        mode = {"sleep": 0.01}
        pool, done = await _pool(lambda m: time.sleep(mode["sleep"]), rescue_s=60, calm_s=1.0)
        queues = {t: ProcessQueue(t, 0, 0) for t in "abcd"}
        await _submit_rounds(pool, queues, 2, 2)
        assert await pool.wait_idle(30)
        waited_limit = pool.busy_limit
        mode["sleep"] = 0
        limits = []
        for k in range(100):  # quick batches until a worker going idle finds the handlers calm
            pool.submit(queues["a"], _msgs("a", 100 + k, 1))
            assert await pool.wait_idle(30)
            limits.append(pool.busy_limit)
            if limits[-1] == 1:
                break
            await asyncio.sleep(0.05)
        pool.shutdown(wait=True)
        return waited_limit, limits

    waited_limit, limits = asyncio.run(main())
    assert waited_limit == 4
    assert limits[0] == 4, limits  # not at once: only once calm_s (1 s) passed without a wait
    assert limits[-1] == 1, limits


def test_min_busy_keeps_that_many_workers_busy_even_while_the_handler_only_computes():
    """`Consumer(threads_min=n)` (the pool's `min_busy`): n queues' batches run at once from the
    start, with no sign of a waiting handler needed (the thresholds set out of reach here). Four
    queues meet at a barrier of four: only four handler calls at once get past it."""
    async def main():
        barrier = threading.Barrier(4, timeout=10)
        passed: list[str] = []

        def handler(m):
            barrier.wait()
            passed.append(m.topic)

        pool, done = await _pool(handler, min_busy=4, block_min_s=60, rescue_s=60)
        for t in "abcd":
            pool.submit(ProcessQueue(t, 0, 0), _msgs(t, 0, 1))
        assert await pool.wait_idle(30)
        limit = pool.busy_limit
        pool.shutdown(wait=True)
        return sorted(passed), limit

    passed, limit = asyncio.run(main())
    assert passed == ["a", "b", "c", "d"]
    assert limit == 4


@pytest.mark.parametrize("threads_min", [0, 9, 1.5, True])
def test_threads_min_out_of_range_is_a_config_error(threads_min):
    with pytest.raises(ConfigError, match="threads_min"):
        Consumer("g", "127.0.0.1:1", threads=8, threads_min=threads_min)
