"""Consumer groups against a real broker: assignment, rebalance, retry/DLQ, orderly, broadcasting,
delayed messages, admin. Consumers run in threads of this process or in subprocesses."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from equeue_core.allocation import allocate
from equeue_core.client import AdminClient, Consumer, Message, Producer
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import Collector
from tests.helpers.waiting import wait_until, wait_until_async

FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1)
LEVELS = "200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms"
# The push Consumer's two threading models: pulls on the loop thread with a worker pool (default),
# and handler threads that pull their own queues (client/pulling_handlers.py); the tests marked
# with `model` hold both to the same guarantees.
MODELS = [pytest.param({}, id="loop_pulls"),
          pytest.param({"pull_in_handler_threads": True}, id="handler_threads_pull")]


@pytest.fixture
def fast_broker(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'delay_levels = "{LEVELS}"\nheartbeat_expiry_s = 5\nqueue_lock_expiry_s = 5\n'
                   f'offset_persist_ms = 200\n')
    with BrokerProcess(tmp_path / "data", config=str(cfg)) as b:
        yield b


def _create(address: str, topic: str, queues: int) -> None:
    with AdminClient(address) as admin:
        admin.create_topic(topic, queues)


@pytest.mark.parametrize("strategy", ["averagely", "averagely_by_circle", "consistent_hash"])
def test_three_consumers_take_exactly_the_strategys_queues(fast_broker, strategy):
    _create(fast_broker.address, "alloc", 8)
    consumers = [Consumer("ga", fast_broker.address, allocation=strategy, **FAST).subscribe("alloc")
                 for _ in range(3)]
    try:
        for c in consumers:
            c.start(lambda m: None)
        ids = [c.client_id for c in consumers]
        queues = [("alloc", q) for q in range(8)]
        expected = {c.client_id: sorted(allocate(strategy, c.client_id, queues, ids)) for c in consumers}

        def settled():
            return all([k for k in c.assigned_queues() if k[0] == "alloc"] == expected[c.client_id]
                       for c in consumers)

        assert wait_until(settled, 15), {c.client_id: c.assigned_queues() for c in consumers}
        with AdminClient(fast_broker.address) as admin:
            info = admin.groups("ga")["ga"]
        assert len(info["members"]) == 3
    finally:
        for c in consumers:
            c.close()


@pytest.mark.parametrize("model", MODELS)
def test_leave_and_join_while_messages_flow_loses_nothing(fast_broker, model):
    _create(fast_broker.address, "flow", 8)
    total = 50_000
    seen: collections.Counter = collections.Counter()
    first_seen: dict[bytes, float] = {}
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen[m.body] += 1
            first_seen.setdefault(m.body, time.monotonic())

    def produce():
        with Producer(fast_broker.address) as p:
            for i in range(0, total, 500):
                p.send_batch([Message("flow", f"{j}".encode()) for j in range(i, i + 500)])
                time.sleep(0.01)

    a = Consumer("gf", fast_broker.address, consume_from="first", **FAST, **model).subscribe("flow")
    b = Consumer("gf", fast_broker.address, consume_from="first", **FAST, **model).subscribe("flow")
    a.start(handler)
    b.start(handler)
    producer = threading.Thread(target=produce)
    producer.start()
    c = None
    try:
        assert wait_until(lambda: len(seen) > 10_000, 60)
        change_started = time.monotonic()
        a.close()  # one consumer leaves mid-stream...
        c = Consumer("gf", fast_broker.address, consume_from="first", **FAST, **model).subscribe("flow")
        c.start(handler)  # ...and another joins
        change_ended = time.monotonic()
        producer.join(120)
        assert wait_until(lambda: len(seen) >= total, 90), f"only {len(seen)} of {total} handled"
    finally:
        producer.join(120)
        b.close()
        if c is not None:
            c.close()
    assert set(seen) == {f"{j}".encode() for j in range(total)}, "a message was never handled"
    dups = [body for body, n in seen.items() if n > 1]
    print(f"\nrebalance under flow: {total} messages, {sum(seen[b] - 1 for b in dups)} duplicates")
    # Duplicates come only from around the change: messages first handled shortly before a queue
    # changed hands (not yet committed) and handled again by the new owner.
    window = FAST["commit_interval"] + FAST["rebalance_interval"] + 5.0
    late_or_early = [b for b in dups if not change_started - window <= first_seen[b] <= change_ended + window]
    assert not late_or_early, f"{len(late_or_early)} duplicates far from the membership change"


@pytest.mark.parametrize("model", MODELS)
def test_failed_messages_retry_with_growing_delays_then_land_in_dlq(fast_broker, model):
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("work", f"{i}".encode(), tag="poison" if i % 10 == 0 else "ok") for i in range(100)])
    attempts: dict[bytes, list[tuple[int, float]]] = collections.defaultdict(list)
    lock = threading.Lock()

    def handler(m):
        with lock:
            attempts[m.body].append((m.reconsume_times, time.monotonic()))
        if m.tag == "poison":
            raise ValueError("poison message")

    c = Consumer("gr", fast_broker.address, consume_from="first", max_reconsume_times=3, **FAST, **model).subscribe("work")
    c.start(handler)
    poison = [f"{i}".encode() for i in range(0, 100, 10)]
    try:
        assert wait_until(lambda: all(len(attempts[b]) >= 4 for b in poison), 60), \
            {b: len(attempts[b]) for b in poison}
        with AdminClient(fast_broker.address) as admin:
            assert wait_until(lambda: len(admin.dlq_messages("gr")) == 10, 20)
            dlq = admin.dlq_messages("gr")
            time.sleep(1.5)  # let a commit happen
            progress = {(r["topic"], r["queue_id"]): r for r in admin.groups("gr")["gr"]["queues"]}
    finally:
        c.close()
    for b in poison:
        times = [r for r, _ in attempts[b]]
        assert times == [0, 1, 2, 3], f"{b!r} reconsume counts {times}"
        stamps = [t for _, t in attempts[b]]
        gaps = [b2 - a2 for a2, b2 in zip(stamps, stamps[1:], strict=False)]
        # levels 3, 4, 5 of LEVELS: 400ms, 500ms, 600ms (allow scheduling slack, never early)
        for gap, due in zip(gaps, (0.4, 0.5, 0.6), strict=True):
            assert gap >= due - 0.05, f"retry came early: {gaps}"
    for i in range(100):
        if i % 10:
            assert len(attempts[f"{i}".encode()]) == 1, "a healthy message was affected"
    assert sorted(m.body for m in dlq) == sorted(poison)
    assert all(m.topic == "work" and m.reconsume_times == 4 for m in dlq)
    rows = [r for (t, _q), r in progress.items() if t == "work" and r["max_offset"] > 0]
    assert rows
    for row in rows:
        assert row["committed"] == row["max_offset"], "the offset did not move past the failed messages"
    shown = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "message", dlq[0].msg_id,
                            "--broker", fast_broker.address], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "poison" in shown.stdout and "RETRY_TOPIC" in shown.stdout
    listed = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "groups", "dlq", "gr",
                             "--broker", fast_broker.address], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 10
    with AdminClient(fast_broker.address) as admin:
        assert admin.resend_dlq("gr") == 10
        assert sum(hi for _, hi in admin.queue_ranges("work")) == 110


def _drain_failing_once(broker: BrokerProcess, topic: str, failing: set[int], *, tag_of=lambda i: None,
                        expression: str = "*", wanted: set[int] | None = None, make_handler=None,
                        **options) -> tuple[dict[int, int], dict]:
    """300 messages (bodies 0..299, tags by tag_of) in one queue, one answer; a consumer (options)
    whose handler fails each of `failing` once. Waits until every wanted message was tried (the
    failing ones twice: they come back as retries) and the whole queue is committed; returns
    how often each message was tried and the consumer's stats. make_handler(note) builds the
    handler around note(m), which counts a try and raises on a first failing one (default:
    note itself)."""
    _create(broker.address, topic, 1)
    with Producer(broker.address) as p:
        p.send_batch([Message(topic, b"%d" % i, tag=tag_of(i)) for i in range(300)])
    wanted = set(range(300)) if wanted is None else wanted
    tries: dict[int, int] = {}
    lock = threading.Lock()

    def note(m):
        n = int(m.body)
        with lock:
            tries[n] = tries.get(n, 0) + 1
        if n in failing and m.reconsume_times == 0:
            raise ValueError("fails once")

    group = f"g{topic}"
    c = Consumer(group, broker.address, consume_from="first", **FAST, **options).subscribe(topic, expression)
    c.start(note if make_handler is None else make_handler(note))
    try:
        assert wait_until(lambda: len(tries) == len(wanted) and all(tries.get(n) == 2 for n in failing), 30), \
            {n: tries.get(n) for n in failing}
        with AdminClient(broker.address) as admin:
            def committed():
                rows = admin.groups(group).get(group, {}).get("queues", [])
                return {r["queue_id"]: r["committed"] for r in rows if r["topic"] == topic}
            assert wait_until(lambda: committed() == {0: 300}, 20), committed()
        stats = dict(c.stats)
    finally:
        c.close()
    assert set(tries) == wanted, "a message was handed out that should not have been"
    assert all(t == 1 for n, t in tries.items() if n not in failing), "a handled message came again"
    return tries, stats


@pytest.mark.parametrize("model", MODELS)
def test_failures_anywhere_in_a_batch_handed_out_in_chunks_are_sent_back_and_the_batch_consumed(fast_broker, model):
    """An answer is handed out a chunk at a time (client/pulled_batch.py decoded_chunks) by both
    models: the failures of every chunk, not only the first, go back to the broker and come back
    as retries, and the whole batch counts as consumed once handled."""
    # in the first, second, third and last chunk
    _drain_failing_once(fast_broker, "chunks", {7, 70, 150, 299}, threads=1, **model)


@pytest.mark.parametrize("model", MODELS)
def test_a_tag_filter_over_an_answer_handed_out_in_chunks_skips_the_others_and_retries_the_failed(fast_broker, model):
    """Every other message tagged "a", the consumer subscribed to "a": the handler sees only
    those, the failures among them (in different chunks) come back once as retries, the others
    are never handed out nor counted as handled, and the whole answer is committed."""
    _, stats = _drain_failing_once(fast_broker, "tagchunks", {8, 70, 150, 298}, expression="a",
                                   tag_of=lambda i: "a" if i % 2 == 0 else "b", wanted=set(range(0, 300, 2)),
                                   threads=1, **model)
    if not model:  # the default model counts what its handler handled, not what the filter skipped
        assert stats["handled"] == 150


@pytest.mark.parametrize("expression", ["*", "a"])
def test_an_async_handler_gets_an_answer_a_chunk_at_a_time_and_its_failures_come_back(fast_broker, expression):
    """A coroutine handler: the answer of 300 waits as bytes (at most a chunk of it exists as
    message objects while the handler is in it; decoded whole, every message was alive until
    handled: ~500 collections in a 200k drain), failures in different chunks come back once as
    retries, and the whole answer is committed. With a tag filter ("a": every other message)
    the same: the filter applies as each chunk is decoded (it decoded the whole answer to
    filter it before), and what it leaves out is not counted as handled."""
    from equeue_core.client.pulled_batch import DECODE_CHUNK
    from tests.helpers.live import live_messages

    topic = "asyncchunks" if expression == "*" else "asynctagchunks"
    live: list[int] = []

    def make_handler(note):
        async def handler(m):
            if m.queue_offset == 100 and not m.reconsume_times:
                live.append(live_messages(topic))
            await asyncio.sleep(0)
            note(m)
        return handler

    tagged = {} if expression == "*" else {"expression": "a", "tag_of": lambda i: "ab"[i % 2],
                                           "wanted": set(range(0, 300, 2))}
    _, stats = _drain_failing_once(fast_broker, topic, {8, 70, 150, 298}, make_handler=make_handler, **tagged)
    assert live and live[0] <= DECODE_CHUNK, f"{live} decoded messages alive inside the answer"
    assert stats["handled"] == (300 if expression == "*" else 150)


def test_a_handler_past_consume_timeout_counts_as_failed(fast_broker):
    with Producer(fast_broker.address) as p:
        p.send(Message("slow", b"sleepy"))
    calls = []

    def handler(m):
        calls.append(m.reconsume_times)
        if m.reconsume_times == 0:
            time.sleep(2.0)

    c = Consumer("gs", fast_broker.address, consume_from="first", consume_timeout=0.5, **FAST).subscribe("slow")
    c.start(handler)
    try:
        assert wait_until(lambda: 1 in calls, 20), calls
    finally:
        c.close()


ORDERLY_CHILD = textwrap.dedent("""
    import sys, time
    from equeue_core.client import Consumer
    out = open(sys.argv[2], "a", buffering=1)
    def handler(m):
        out.write(f"{m.queue_id} {m.queue_offset} {m.body.decode()}\\n")
        time.sleep(0.002)
    c = Consumer("go", sys.argv[1], orderly=True, consume_from="first", heartbeat_interval=0.5,
                 rebalance_interval=1.0, commit_interval=0.3, lock_interval=1.0)
    c.subscribe("ordered")
    c.start(handler)
    time.sleep(120)
""")


def test_orderly_keeps_queue_order_across_a_rebalance_after_a_kill(fast_broker, tmp_path):
    n_keys, per_key = 8, 150
    with Producer(fast_broker.address) as p:
        for seq in range(per_key):
            for k in range(n_keys):
                p.send_async(Message("ordered", f"k{k}:{seq}".encode()), routing_key=f"k{k}")
        p.flush()
    log_a = tmp_path / "a.log"
    script = tmp_path / "child.py"
    script.write_text(ORDERLY_CHILD)
    child = subprocess.Popen([sys.executable, str(script), fast_broker.address, str(log_a)])
    got_b: list[tuple[int, int, str]] = []
    b = None
    try:
        assert wait_until(lambda: log_a.exists() and len(log_a.read_text().splitlines()) > 300, 60)
        child.kill()  # mid-stream
        child.wait(10)
        b = Consumer("go", fast_broker.address, orderly=True, consume_from="first", **FAST).subscribe("ordered")
        b.start(lambda m: got_b.append((m.queue_id, m.queue_offset, m.body.decode())))
        total = n_keys * per_key
        a_lines = [line.split() for line in log_a.read_text().splitlines()]
        got_a = [(int(q), int(o), body) for q, o, body in a_lines]
        assert wait_until(lambda: len({x[2] for x in got_a} | {x[2] for x in got_b}) >= total, 60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if b is not None:
            b.close()
    for stream in (got_a, got_b):
        per_queue: dict[int, list[int]] = collections.defaultdict(list)
        per_key_seq: dict[str, list[int]] = collections.defaultdict(list)
        for q, off, body in stream:
            per_queue[q].append(off)
            key, seq = body.split(":")
            per_key_seq[key].append(int(seq))
        for q, offs in per_queue.items():
            assert offs == sorted(offs) and len(set(offs)) == len(offs), f"queue {q} out of order"
        for key, seqs in per_key_seq.items():
            assert seqs == sorted(seqs), f"key {key} out of order"
    # B continues each queue from the committed offset: at or before where A stopped, never past it
    last_a = collections.defaultdict(lambda: -1)
    for q, off, _ in got_a:
        last_a[q] = max(last_a[q], off)
    first_b = {}
    for q, off, _ in got_b:
        first_b.setdefault(q, off)
    for q, off in first_b.items():
        assert off <= last_a[q] + 1, f"queue {q}: B skipped from {last_a[q]} to {off}"


def test_broadcasting_consumers_each_get_everything_and_resume_locally(fast_broker, tmp_path):
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("news", f"n{i}".encode()) for i in range(300)])
    cols = [Collector(300) for _ in range(3)]
    consumers = [Consumer("gb", fast_broker.address, mode="broadcasting", consume_from="first",
                          offset_dir=str(tmp_path / f"c{i}"), **FAST).subscribe("news") for i in range(3)]
    for c, col in zip(consumers, cols, strict=True):
        c.start(col)
    try:
        for col in cols:
            assert col.wait(30)
    finally:
        for c in consumers:
            c.close()
    for col in cols:
        assert sorted(b for *_, b in col.items) == sorted(f"n{i}".encode() for i in range(300))
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("news", f"late{i}".encode()) for i in range(50)])
    again = Collector(50)
    c = Consumer("gb", fast_broker.address, mode="broadcasting", consume_from="first",
                 offset_dir=str(tmp_path / "c0"), **FAST).subscribe("news")
    c.start(again)
    try:
        assert again.wait(30)
        time.sleep(0.5)
    finally:
        c.close()
    assert sorted(b for *_, b in again.items) == sorted(f"late{i}".encode() for i in range(50))


def test_delayed_messages_wait_and_survive_a_restart_once(fast_broker):
    import datetime as dt

    sent_at = time.time()
    with Producer(fast_broker.address) as p:
        p.send(Message("later", b"level-8", delay_level=8))  # 900 ms
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=4)
        p.send(Message("later", b"absolute", deliver_at=at))
    got: list[tuple[bytes, float]] = []
    c = Consumer("gd", fast_broker.address, consume_from="first", **FAST).subscribe("later")
    c.start(lambda m: got.append((m.body, time.time())))
    try:
        assert wait_until(lambda: len(got) == 1, 10)
        assert got[0][0] == b"level-8" and got[0][1] - sent_at >= 0.85
        c.close()
        fast_broker.restart()  # the absolute one is still pending across the restart
        c = Consumer("gd", fast_broker.address, consume_from="first", **FAST).subscribe("later")
        c.start(lambda m: got.append((m.body, time.time())))
        assert wait_until(lambda: len(got) == 2, 15)
        time.sleep(1.5)
    finally:
        c.close()
    assert [b for b, _ in got] == [b"level-8", b"absolute"], "delivered twice or lost"
    assert got[1][1] >= at.timestamp() - 0.05, "delivered early"


def test_admin_reports_lag_and_resets_offsets(fast_broker):
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("adm", f"{i}".encode()) for i in range(40)])
    col = Collector(40)
    c = Consumer("gadm", fast_broker.address, consume_from="first", **FAST).subscribe("adm")
    c.start(col)
    assert col.wait(20)
    c.close()
    with AdminClient(fast_broker.address) as admin:
        rows = admin.groups("gadm")["gadm"]["queues"]
        assert sum(r["lag"] for r in rows if r["topic"] == "adm") == 0
        admin.reset_offsets("gadm", "adm", "earliest")
        rows = admin.groups("gadm")["gadm"]["queues"]
        assert sum(r["lag"] for r in rows if r["topic"] == "adm") == 40
    again = Collector(40)
    c = Consumer("gadm", fast_broker.address, **FAST).subscribe("adm")
    c.start(again)
    try:
        assert again.wait(20), "reset to earliest did not make the group read again"
    finally:
        c.close()
    r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "groups", "show", "gadm",
                        "--broker", fast_broker.address], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ))
    assert r.returncode == 0 and "adm" in r.stdout and "lag" in r.stdout


def test_flow_control_pauses_pulling_a_full_queue(fast_broker):
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("flowctl", b"x" * 10) for _ in range(2000)], routing_key="one")
    peak = 0
    stop = threading.Event()
    c = Consumer("gfc", fast_broker.address, consume_from="first", flow_max_messages=64, pull_batch=16,
                 parallel_per_queue=4, **FAST).subscribe("flowctl")

    def watch():
        nonlocal peak
        while not stop.is_set():
            for pq in list(c._async.queues.values()):
                peak = max(peak, pq.count)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    c.start(lambda m: time.sleep(0.002))
    try:
        time.sleep(2.0)
    finally:
        stop.set()
        watcher.join(5)
        c.close()
    assert 0 < peak <= 64 + 16, f"{peak} messages cached for one queue"


def test_a_new_group_can_start_from_a_timestamp(fast_broker):
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("since", b"old") for _ in range(20)])
        time.sleep(0.3)
        since = int(time.time() * 1000)
        time.sleep(0.05)
        p.send_batch([Message("since", b"new") for _ in range(20)])
    col = Collector(20)
    c = Consumer("gts", fast_broker.address, consume_from=since, **FAST).subscribe("since")
    c.start(col)
    try:
        assert col.wait(20)
        time.sleep(0.5)
    finally:
        c.close()
    assert [b for *_, b in col.items] == [b"new"] * 20


def test_orderly_failure_suspends_the_queue_retries_then_dead_letters(fast_broker):
    with Producer(fast_broker.address) as p:
        for i in range(30):
            p.send(Message("strict", f"{i}".encode(), tag="poison" if i == 10 else None), routing_key="one")
    seen: list[tuple[bytes, int]] = []

    def handler(m):
        seen.append((m.body, m.reconsume_times))
        if m.tag == "poison":
            raise ValueError("poison")

    c = Consumer("gof", fast_broker.address, orderly=True, consume_from="first", max_reconsume_times=2,
                 **FAST).subscribe("strict")
    c.start(handler)
    try:
        assert wait_until(lambda: len({b for b, _ in seen}) == 30, 30)
        with AdminClient(fast_broker.address) as admin:
            assert wait_until(lambda: len(admin.dlq_messages("gof")) == 1, 10)
            assert admin.dlq_messages("gof")[0].body == b"10"
    finally:
        c.close()
    bodies = [b for b, _ in seen]
    assert bodies[:10] == [f"{i}".encode() for i in range(10)]
    assert bodies[10:13] == [b"10", b"10", b"10"], "the poison message was not retried in place"
    assert [r for b, r in seen if b == b"10"] == [0, 1, 2]
    assert bodies[13:] == [f"{i}".encode() for i in range(11, 30)], "order broken after the failure"


@pytest.mark.parametrize("model", MODELS)
def test_a_failed_send_back_is_retried_locally_and_holds_the_offset(fast_broker, model):
    with Producer(fast_broker.address) as p:
        p.send_batch([Message("fragile", f"{i}".encode()) for i in range(20)], routing_key="one")
    calls: list[tuple[bytes, int, str]] = []
    killed = threading.Event()
    started = threading.Event()

    def handler(m):
        calls.append((m.body, m.reconsume_times, m.source_topic))
        if m.body == b"5" and not killed.is_set():
            started.wait(10)  # let start() finish its own requests first
            fast_broker.kill()  # the broker dies: this failure cannot be sent back
            killed.set()
            raise RuntimeError("fails while the broker is down")

    c = Consumer("gsb", fast_broker.address, consume_from="first", **FAST, **model).subscribe("fragile")
    c.start(handler)
    started.set()
    try:
        assert killed.wait(20)
        time.sleep(1.0)
        fast_broker.start()
        assert wait_until(lambda: [b for b, *_ in calls].count(b"5") >= 2, 30), calls
        assert wait_until(lambda: {b for b, *_ in calls} >= {f"{i}".encode() for i in range(20)}, 30)
    finally:
        c.close()
    retries = [(r, src) for b, r, src in calls if b == b"5"]
    assert retries[0] == (0, "fragile")
    assert retries[1][1] == "fragile", "retried locally, not through the retry topic"
    with AdminClient(fast_broker.address) as admin:
        rows = [r for r in admin.groups("gsb")["gsb"]["queues"] if r["topic"] == "fragile" and r["max_offset"]]
    assert rows and all(r["committed"] == r["max_offset"] for r in rows), rows


def test_async_handlers_run_as_tasks_and_batches_reach_batch_handlers(fast_broker):
    import asyncio

    from equeue_core.client import AsyncConsumer

    with Producer(fast_broker.address) as p:
        p.send_batch([Message("shapes", f"{i}".encode()) for i in range(200)], routing_key="k")

    async def run_async_consumer() -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        async def handler(m):
            await asyncio.sleep(0)  # a coroutine handler, awaited on the consumer's loop
            got.append(m.body)
            if len(got) >= 200:
                done.set()

        c = AsyncConsumer("g-async", fast_broker.address, consume_from="first", **FAST).subscribe("shapes")
        await c.start(handler)
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            await c.close()
        return got

    got = asyncio.run(run_async_consumer())
    assert sorted(got, key=int) == [f"{i}".encode() for i in range(200)]

    sizes: list[int] = []
    col = Collector(200)

    def batch_handler(msgs):
        sizes.append(len(msgs))
        for m in msgs:
            col(m)

    c = Consumer("g-batch", fast_broker.address, consume_from="first", consume_batch_size=10,
                 **FAST).subscribe("shapes")
    c.start(batch_handler)
    try:
        assert col.wait(30)
    finally:
        c.close()
    assert max(sizes) == 10 and all(1 <= s <= 10 for s in sizes)
    assert sorted(b for *_, b in col.items) == sorted(f"{i}".encode() for i in range(200))


def test_an_async_handler_may_close_its_own_consumer(fast_broker):
    """close() from inside a coroutine handler (a task of the consumer's own) returns at once:
    it does not wait out drain_timeout for the handler that called it. What that handler did not
    finish is not committed, so the group gets it again (at least once)."""
    from equeue_core.client import AsyncConsumer

    with Producer(fast_broker.address) as p:
        p.send_batch([Message("selfclose", b"%d" % i) for i in range(100)], routing_key="k")

    async def close_from_the_handler() -> list[bytes]:
        got: list[bytes] = []
        closed = asyncio.Event()

        async def handler(m):
            got.append(m.body)
            if len(got) == 10:
                await c.close(drain_timeout=120)
                closed.set()

        c = AsyncConsumer("g-self", fast_broker.address, consume_from="first", **FAST).subscribe("selfclose")
        await c.start(handler)
        try:
            await asyncio.wait_for(closed.wait(), 60)
        finally:
            await c.close()
        return got

    first = asyncio.run(close_from_the_handler())
    assert len(first) >= 10
    rest = Collector(1)
    with Consumer("g-self", fast_broker.address, consume_from="first", **FAST).subscribe("selfclose") as c:
        c.start(rest)
        assert wait_until(lambda: b"99" in {b for *_, b in rest.items}, timeout=60)
    assert {b for *_, b in rest.items} | set(first) == {b"%d" % i for i in range(100)}


def test_close_lets_a_rebalance_in_progress_finish(fast_broker, caplog):
    """A rebalance that starts just before close() (here: the other member left, so this one
    takes its queues: several round trips) runs to its end on the open connection: no
    "rebalance failed" for a connection close() shut under it, whichever step of it close()
    came in at."""
    import logging

    from equeue_core.client import AsyncConsumer

    with AdminClient(fast_broker.address) as admin:
        admin.create_topic("racing", 8)

    async def rebalance_then_close(steps: int) -> None:
        a, b = (AsyncConsumer("g-race", fast_broker.address, consume_from="first", **FAST).subscribe("racing")
                for _ in range(2))
        await a.start(lambda m: None)
        await b.start(lambda m: None)
        await wait_until_async(lambda: len(a.queues) == 4 and len(b.queues) == 4, timeout=30, what="4 queues each")
        await a.close()
        b.rebalance_soon(0.0)  # as the broker's GROUP_CHANGED for a's leaving does
        for _ in range(steps):  # let the rebalance get that far: its task, its first request...
            await asyncio.sleep(0)
        await b.close()

    with caplog.at_level(logging.WARNING, logger="equeue.consumer"):
        for steps in list(range(6)) * 2:
            asyncio.run(rebalance_then_close(steps))
    failed = [r.getMessage() for r in caplog.records if "rebalance failed" in r.getMessage()]
    assert not failed, failed
