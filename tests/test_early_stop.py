"""A consumer that stops early commits only what its handler finished: the CLI with --count, and
close() while pulled messages are still buffered. Otherwise the group skips messages nobody saw."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from equeue_core.client import AdminClient, Consumer, Message, Producer

FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1)


def committed(address: str, group: str, topic: str) -> dict[int, int]:
    """queue -> messages committed past the queue's start (0 when the group never committed)."""
    with AdminClient(address) as admin:
        rows = admin.groups(group)[group]["queues"]
    return {r["queue_id"]: (r["committed"] - r["min_offset"]) if r["committed"] is not None else 0
            for r in rows if r["topic"] == topic}


def test_cli_consume_with_count_commits_only_the_printed_messages(file_broker):
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("clitopic", 4)
    with Producer(file_broker.address) as p:
        for q in range(4):
            p.send_batch([Message("clitopic", f"q{q}-{i}".encode()) for i in range(60)], routing_key=f"k{q}")
    r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "consume", "--topic", "clitopic",
                        "--group", "cli", "--count", "3", "--broker", file_broker.address],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = [line.split("\t") for line in r.stdout.splitlines()]
    assert len(printed) == 3
    seen: dict[int, list[int]] = {}
    for _topic, q, off, *_ in printed:
        seen.setdefault(int(q), []).append(int(off))
    expected = {q: max(offs) + 1 for q, offs in seen.items()}
    got = {q: n for q, n in committed(file_broker.address, "cli", "clitopic").items() if n}
    assert got == expected, f"printed {seen}, committed {got}: the group would skip unseen messages"


def test_close_with_buffered_messages_commits_only_what_the_handler_finished(file_broker):
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("buffered", 1)
    with Producer(file_broker.address) as p:
        p.send_batch([Message("buffered", f"{i}".encode()) for i in range(100)])
    finished: list[int] = []
    started: list[tuple[int, float]] = []
    lock = threading.Lock()

    def handler(m):
        with lock:
            started.append((m.queue_offset, time.monotonic()))
        time.sleep(0.1)
        with lock:
            finished.append(m.queue_offset)

    c = Consumer("gclose", file_broker.address, consume_from="first", pull_batch=32, **FAST).subscribe("buffered")
    c.start(handler)
    deadline = time.monotonic() + 30
    while len(finished) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    closing = time.monotonic()
    c.close()
    after = [o for o, t in started if t > closing]
    # at most one call may start in the instant between `closing` and close() reaching the loop
    assert len(after) <= 1, f"close() handed {len(after)} more buffered messages to the handler"
    assert finished == list(range(len(finished)))
    assert committed(file_broker.address, "gclose", "buffered") == {0: len(finished)}
