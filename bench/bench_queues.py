"""Is the cost flat in queue count? Produce and consume rates with 4, 100 and 1000 queues in one
topic and with 100 topics of 4 queues, and the broker's memory per queue and per idle connection.

Each case runs a fresh broker process (file store, tcp, flush async) so its memory deltas are its
own; the producer (`send_async`, 100 B or `--size`, round robin over the topics) and the consumer (one
Consumer at its default settings, or with `--pull-in-handler-threads` its pulling handler threads,
subscribed to every topic) are separate processes. Memory is
the broker's VmRSS from /proc. Prints one JSON line per case.

One-time costs are reported apart from the rates, never hidden: `create_topics_s` (creating the
case's topics), `consume_start_s` (from Consumer.start until it holds every queue: start offsets
asked, pull loops begun) and `consume_steady_msgs_per_s` (the rate after that; null when the
consumer was done before it held its last queue). `cpu_us_per_msg` is CPU time per message of the
producer, consumer and broker (utime + stime from /proc): what to compare on a loaded machine,
where the rates swing with the other processes. `consumer_gc` and `consumer_lite_gc`: the consumer
process's garbage collections during its drain (count, summed and longest pause in ms; a
collection stops every thread of the process). `broker_minor_faults_consume` counts the pages the
broker touched for the first time while the consumer drained the case (answers built into fresh
memory). Then a LitePullConsumer (group of its own) drains the same messages again:
`consume_lite_msgs_per_s`, its CPU and the broker's (`consumer_lite`, `broker_consume_lite`) and
`broker_minor_faults_consume_lite`. `producer_threads_ms` and `consumer_threads_ms`: each
process's time in ms by thread (`caller`, the client's `loop` thread, the push Consumer's
`handlers`; bench/thread_cpu.py), `cpu` on a CPU and `runq` runnable but waiting for one. The
threads of a process share one GIL, so their `cpu` summed bounds its rate, and the part that
grows with the queue count shows where a case's time went.

Then (`--paced-seconds`, default 3 s) `send_async` paced at `--paced-rate` msg/s (50k) in bursts of
50, round robin over 100 topics of 4 queues, every queue written once first (bench
"queues_paced"): the latency from each send to its answer's callback (every 97th message) and the
producer's and broker's CPU a message. Then the same over 100 topics created 1 s before, none
written (bench "queues_paced_cold"): every queue's first write is in the run. Below saturation, where a many-topic producer's batches are
small, this is what the frames and sections a message cost show as (docs/benchmarks.md, "Many
topics in one frame").

Then (`--sync-seconds`, default 3 s each) `Producer.send` one by one against a flush=sync broker
over 4 and over 1000 queues: rate and latency percentiles (bench "sync_sends"); the tail shows any
work a send waits for that grows with the queue count.

    .venv/bin/python -m bench.bench_queues                 # 100k messages a case
    .venv/bin/python -m bench.bench_queues --count 20000 --connections 200
    .venv/bin/python -m bench.bench_queues --count 300000 --rounds 5 --sync-seconds 0 --connections 0 --paced-seconds 0

`--rounds N` runs the cases round after round and ends with one "queues_ratio" row per case:
the median of each rate, and its ratio to the 4-queue case of the same round (median, lowest,
highest), the push Consumer's also without its start (`consume_steady_vs_4_queues`), and each
process's CPU a message against the same round's 4 queues (`cpu_per_msg_vs_4_queues`, >1:
costlier): the work a message took, where a rate also counts the CPU the machine gave that
minute (the CPU a message moves too, with the kernel's copies). One round's ratio moves with
the machine's minute; the medians of several do less.
Each round starts one case further on (`round_cases`: round r runs the cases from the r-th on,
then the first ones), so over a multiple of four rounds every case runs in every place of a round
once, and the 4-queue case is not always the first. Its `position` says where a case ran. With
the order fixed, the same tree gave the 100-topic case 0.72-0.76x of the 4-queue rates in five
rounds, and 0.91-0.97x in five rounds with the order reversed (docs/benchmarks.md, "The broker's
startup heap out of the GC, and queue-count rounds in turn").

`--count` sets how much of a case is one-time work per queue: the consumer's start and each
queue's first pulls (one for its backlog, one held once it caught up) are paid per queue, not per
message. 300k messages over 1000 queues are 300 a queue, and that work shows in the rates; at 3M
it hardly does (docs/benchmarks.md, "Queue count at 300 and at 3000 messages a queue").

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.answer_window import AnswerWindow  # noqa: E402
from bench.child import role_result  # noqa: E402
from bench.gc_pauses import GcPauses  # noqa: E402
from bench.peers.common import summary  # noqa: E402
from bench.thread_cpu import ThreadCpu  # noqa: E402
from tests.helpers.broker import BrokerProcess  # noqa: E402
from tests.helpers.counting import CountingHandler  # noqa: E402

CASES = [("1 topic x 4 queues", 1, 4), ("1 topic x 100 queues", 1, 100), ("1 topic x 1000 queues", 1, 1000),
         ("100 topics x 4 queues", 100, 4)]


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: fields[0] is the state, fields[7] minflt."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far: memory it touched for the first time, e.g. answers
    built into fresh pages."""
    return int(_stat_fields(pid)[7])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc: CPU spent, whatever the load."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled_rss_kb(pid: int, wait: float = 1.0) -> int:
    time.sleep(wait)  # let the broker finish what the last request started
    return rss_kb(pid)


def _child(args: list[str], timeout: float = 600) -> dict:
    return role_result([sys.executable, "-m", "bench.bench_queues", "--role", *args], what=f"role {args[0]}",
                       cwd=ROOT, timeout=timeout)


def role_produce(address: str, topics: list[str], count: int, size: int) -> dict:
    from equeue_core.client import Message, Producer

    body = b"x" * size
    with Producer(address) as p:
        for t in topics:
            p.send(Message(t, body))  # routes, not timed
        start = time.perf_counter()
        cpu = time.process_time()
        threads = ThreadCpu()
        window = AnswerWindow()
        for i in range(count):
            window.add(p.send_async(Message(topics[i % len(topics)], body)))
        window.drain()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        threads_ms = threads.stop()
    return {"count": count, "seconds": elapsed, "msgs_per_s": count / elapsed, "cpu_seconds": cpu,
            "threads_ms": threads_ms}


def role_consume(address: str, topics: list[str], count: int, offset_dir: str, queues: int,
                 pulling: bool = False) -> dict:
    from equeue_core.client import Consumer

    handler = CountingHandler(count)

    options = {"pull_in_handler_threads": True} if pulling else {"offset_dir": offset_dir}
    c = Consumer("drain", address, consume_from="first", **options)
    for t in topics:
        c.subscribe(t)
    start = time.perf_counter()
    cpu = time.process_time()
    pauses = GcPauses()
    threads = ThreadCpu()
    c.start(handler)
    # the one-time cost: until the consumer holds every queue (start offsets asked, pulls begun)
    deadline = start + 600
    while len(c.assigned_queues()) < queues and not handler.done.is_set() and time.perf_counter() < deadline:
        time.sleep(0.002)
    assigned = time.perf_counter()
    seen_assigned = handler.seen
    handler.done.wait(600)
    elapsed = time.perf_counter() - start
    steady = time.perf_counter() - assigned
    cpu = time.process_time() - cpu
    gc_pauses = pauses.stop()
    threads_ms = threads.stop()
    c.close()
    return {"count": handler.seen, "seconds": elapsed, "msgs_per_s": handler.seen / elapsed,
            "start_seconds": assigned - start, "cpu_seconds": cpu, "gc": gc_pauses, "threads_ms": threads_ms,
            # None: every message was consumed before the consumer held its last queue
            "steady_msgs_per_s": (handler.seen - seen_assigned) / steady if seen_assigned < count else None}


def role_consume_lite(address: str, topics: list[str], count: int) -> dict:
    """The same drain with a LitePullConsumer (poll in this thread, one pull per queue in flight,
    at most max_backlog_queues of them for queues with a backlog), in a group of its own."""
    from equeue_core.client import LitePullConsumer

    c = LitePullConsumer("drain-lite", address, consume_from="first")
    for t in topics:
        c.assign(t)
    seen = 0
    start = time.perf_counter()
    cpu = time.process_time()
    pauses = GcPauses()
    deadline = start + 600
    while seen < count and time.perf_counter() < deadline:
        seen += len(c.poll(1.0))
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    gc_pauses = pauses.stop()
    c.close()
    return {"count": seen, "seconds": elapsed, "msgs_per_s": seen / elapsed, "cpu_seconds": cpu, "gc": gc_pauses,
            "backlog_queues_peak": c.stats["backlog_queues_peak"]}


def run_case(tmp: Path, label: str, n_topics: int, queues: int, count: int, pulling: bool = False,
             round_no: int = 0, size: int = 100) -> dict:
    """One case in a fresh broker: a data dir of its own (per round: never one a round before
    filled), removed afterwards."""
    from equeue_core.client import AdminClient

    data = tmp / f"data-{n_topics}-{queues}-r{round_no}"
    b = BrokerProcess(data, flush="async").start()
    try:
        pid = b.proc.pid
        with AdminClient(b.address) as admin:
            admin.broker_info()
            rss_start = settled_rss_kb(pid)
            topics = [f"q{queues}-t{i}" for i in range(n_topics)]
            created = time.perf_counter()
            for t in topics:
                admin.create_topic(t, queues=queues)
            create_seconds = time.perf_counter() - created
            rss_created = settled_rss_kb(pid)
        total = n_topics * queues
        cpu0 = cpu_seconds(pid)
        prod = _child(["produce", b.address, ",".join(topics), str(count), str(size)])
        cpu1 = cpu_seconds(pid)
        rss_produced = settled_rss_kb(pid)
        cpu2 = cpu_seconds(pid)
        faults2 = minor_faults(pid)
        cons = _child(["consume", b.address, ",".join(topics), str(count), str(tmp / f"offsets-{label}-r{round_no}"),
                       str(total), "pulling" if pulling else "loop"])
        cpu3 = cpu_seconds(pid)
        faults3 = minor_faults(pid)
        rss_consumed = settled_rss_kb(pid)
        lite = _child(["consume_lite", b.address, ",".join(topics), str(count)])
        cpu4 = cpu_seconds(pid)
        faults4 = minor_faults(pid)
        us = 1e6 / count
        return {"bench": "queues", "case": label, "round": round_no, "consumer_model": "pulling" if pulling else "loop",
                "topics": n_topics, "queues_per_topic": queues,
                "queues": total, "count": count, "size": size,
                "produce_msgs_per_s": round(prod["msgs_per_s"], 1), "consume_msgs_per_s": round(cons["msgs_per_s"], 1),
                "consume_start_s": round(cons["start_seconds"], 3),
                "consume_steady_msgs_per_s": cons["steady_msgs_per_s"] and round(cons["steady_msgs_per_s"], 1),
                "consume_lite_msgs_per_s": round(lite["msgs_per_s"], 1),
                "create_topics_s": round(create_seconds, 3),
                "cpu_us_per_msg": {"producer": round(prod["cpu_seconds"] * us, 2),
                                   "broker_produce": round((cpu1 - cpu0) * us, 2),
                                   "consumer": round(cons["cpu_seconds"] * us, 2),
                                   "broker_consume": round((cpu3 - cpu2) * us, 2),
                                   "consumer_lite": round(lite["cpu_seconds"] * us, 2),
                                   "broker_consume_lite": round((cpu4 - cpu3) * us, 2)},
                "broker_minor_faults_consume": faults3 - faults2,
                "broker_minor_faults_consume_lite": faults4 - faults3,
                # the consumer process's garbage collections during its drain (bench/gc_pauses.py)
                "consumer_gc": cons["gc"], "consumer_lite_gc": lite["gc"],
                # the producer's and the consumer's time by thread (bench/thread_cpu.py): their
                # threads share one GIL, so the sum is the bound, and the part that grows with
                # the queue count says where
                "producer_threads_ms": prod["threads_ms"], "consumer_threads_ms": cons["threads_ms"],
                "consumed": cons["count"], "consumed_lite": lite["count"],
                "backlog_queues_peak_lite": lite["backlog_queues_peak"], "rss_mb_start": round(rss_start / 1024, 1),
                "rss_mb_after": round(rss_consumed / 1024, 1),
                "rss_kb_per_queue_created": round((rss_created - rss_start) / total, 2),
                "rss_kb_per_queue_used": round((rss_consumed - rss_start) / total, 2),
                "rss_mb_after_produce": round(rss_produced / 1024, 1)}
    finally:
        b.stop()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(tmp / f"offsets-{label}-r{round_no}", ignore_errors=True)


RATES = ("produce_msgs_per_s", "consume_msgs_per_s", "consume_steady_msgs_per_s", "consume_lite_msgs_per_s")


def round_cases(cases: list, round_no: int) -> list:
    """The cases of round `round_no` in the order they run: from case `round_no % len(cases)` on,
    then the ones before it (see the module docstring)."""
    if not cases:
        return []
    first = round_no % len(cases)
    return cases[first:] + cases[:first]


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Per case over its rounds (bench "queues_ratio"): each rate's median, and its ratio to the
    4-queue case of the same round (median, lowest, highest). A round's cases run one after
    another, so a ratio within a round shares that minute's machine; the 4-queue rate swings
    from minute to minute as much as the cases differ (docs/benchmarks.md, "Where a many-queue
    drain's time goes"). Empty without the 4-queue case.

    `consume_steady`: the push Consumer's rate once it held every queue, so the one-time start
    (start offsets asked, a pull loop begun per queue) is out of the ratio. A round where either
    side has none (the drain ended first) is left out of that ratio; None when no round has both."""
    base = {row["round"]: row for row in rows if row["queues"] == 4 and row["topics"] == 1}
    if not base:
        return []
    out = []
    for label in dict.fromkeys(row["case"] for row in rows):
        mine = [row for row in rows if row["case"] == label]
        result: dict = {"bench": "queues_ratio", "case": label, "rounds": len(mine)}
        for key in RATES:
            rates = [row[key] for row in mine if row.get(key)]
            ratios = sorted(row[key] / base[row["round"]][key] for row in mine
                            if row.get(key) and row["round"] in base and base[row["round"]].get(key))
            result[key] = round(statistics.median(rates), 1) if rates else None
            result[key.replace("_msgs_per_s", "_vs_4_queues")] = _spread(ratios)
        # what a message costs each process, against the same round's 4 queues (>1: costlier)
        costs = {}
        for role in COST_ROLES:
            ratios = sorted(row["cpu_us_per_msg"][role] / base[row["round"]]["cpu_us_per_msg"][role]
                            for row in mine if row["round"] in base and _cost(row, role)
                            and _cost(base[row["round"]], role))
            costs[role] = _spread(ratios)
        result["cpu_per_msg_vs_4_queues"] = costs
        out.append(result)
    return out


COST_ROLES = ("producer", "broker_produce", "consumer", "broker_consume", "consumer_lite", "broker_consume_lite")


def _cost(row: dict, role: str) -> bool:
    """Whether a row has a CPU time a message for `role` to divide by (a row of a run that
    measured none, or a process too short for the clock's 10 ms ticks, has none)."""
    return bool(row.get("cpu_us_per_msg", {}).get(role))


def _spread(ratios: list[float]) -> dict | None:
    """Median, lowest and highest of sorted ratios; None for none."""
    return {"median": round(statistics.median(ratios), 3), "low": round(ratios[0], 3),
            "high": round(ratios[-1], 3)} if ratios else None


PACED_TOPICS = 100
PACED_BURST = 50
PACED_SAMPLE_EVERY = 97  # messages: one latency sample each (a done callback)
PACED_COLD_PAUSE = 1.0  # s between creating the cold case's topics and its first send


def role_paced(address: str, topics: list[str], rate: int, seconds: float) -> dict:
    """`send_async` of 100 B paced at `rate` msg/s in bursts of PACED_BURST, round robin over
    `topics` (whose every queue was written before): latency from the send to the answer's
    callback for every PACED_SAMPLE_EVERY-th message, and this process's CPU a message."""
    from equeue_core.client import Message, Producer

    body = b"x" * 100
    lats: list[float] = []
    count = int(rate * seconds) // PACED_BURST * PACED_BURST
    step = PACED_BURST / rate
    with Producer(address) as p:
        for t in topics:  # routes, and the producer's connections warm
            p.send(Message(t, body))
        cpu = time.process_time()
        start = time.perf_counter()
        perf = time.perf_counter
        for burst in range(count // PACED_BURST):
            due = start + burst * step
            if perf() < due:
                time.sleep(due - perf())
            for i in range(burst * PACED_BURST, (burst + 1) * PACED_BURST):
                f = p.send_async(Message(topics[i % len(topics)], body))
                if i % PACED_SAMPLE_EVERY == 0:
                    sent = perf()
                    f.add_done_callback(lambda _f, sent=sent: lats.append((perf() - sent) * 1e3))
        p.flush()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        multi = getattr(p, "multi_frames", None)  # (None: a tree from before SEND_MULTI, as a baseline)
    time.sleep(0.1)  # the last callbacks
    lat = summary(lats, (0.5, 0.9, 0.99))
    return {**lat, "samples": lat["count"], "count": count, "msgs_per_s": count / elapsed, "cpu_seconds": cpu,
            "multi_frames": multi}


def run_paced(tmp: Path, rate: int, seconds: float, warm: bool = True) -> dict:
    """role_paced against a fresh broker whose 100 topics x 4 queues were each written first,
    with the broker's CPU a message (bench "queues_paced"). With `warm` False (bench
    "queues_paced_cold") the topics are only created, PACED_COLD_PAUSE before the sends: each
    queue's first write is in the run, which shows whether creating a queue's files costs the
    broker's loop (docs/benchmarks.md, "A queue's first write off the loop")."""
    from equeue_core.client import AdminClient

    b = BrokerProcess(tmp / f"data-paced-{'warm' if warm else 'cold'}", flush="async").start()
    try:
        topics = [f"paced-t{i}" for i in range(PACED_TOPICS)]
        with AdminClient(b.address) as admin:
            created = time.perf_counter()
            for t in topics:
                admin.create_topic(t, queues=4)
            create_seconds = time.perf_counter() - created
        if warm:
            _warm_queues(b.address, [(t, q) for t in topics for q in range(4)])
        else:
            time.sleep(PACED_COLD_PAUSE)
        cpu0 = cpu_seconds(b.proc.pid)
        out = _child(["paced", b.address, ",".join(topics), str(rate), str(seconds)])
        broker_cpu = cpu_seconds(b.proc.pid) - cpu0
        us = 1e6 / out["count"]
        return {"bench": "queues_paced" if warm else "queues_paced_cold", "topics": PACED_TOPICS,
                "queues_per_topic": 4, "rate": rate, "create_topics_s": round(create_seconds, 3),
                "msgs_per_s": round(out["msgs_per_s"], 1), "count": out["count"],
                "p50_ms": out["p50_ms"], "p90_ms": out["p90_ms"], "p99_ms": out["p99_ms"], "max_ms": out["max_ms"],
                "samples": out["samples"], "multi_frames": out["multi_frames"],
                "cpu_us_per_msg": {"producer": round(out["cpu_seconds"] * us, 2), "broker": round(broker_cpu * us, 2)}}
    finally:
        b.stop()


def _warm_queues(address: str, queues: list[tuple[str, int]]) -> None:
    """One record into each (topic, queue id), by queue id (a raw SEND each)."""
    import asyncio

    from equeue_core.client import Message
    from equeue_core.client.connection import BrokerConnection
    from equeue_core.codes import Code

    async def go() -> None:
        conn = await BrokerConnection(address).connect()
        try:
            for topic, q in queues:
                await conn.request(Code.SEND, {"topic": topic, "queue_id": q}, Message(topic, b"warm-up").encode(q))
        finally:
            await conn.close()

    asyncio.run(go())


def run_sync_sends(tmp: Path, queues: int, seconds: float) -> dict:
    """`Producer.send` one by one for `seconds` against a flush=sync broker, spread over `queues`
    queues (so that many index files are written): the rate and the latency percentiles. The tail
    shows whether a send waits for work that grows with the queue count (a checkpoint's index
    fsyncs did, once a second)."""
    from equeue_core.client import AdminClient, Message, Producer

    b = BrokerProcess(tmp / f"data-sync-{queues}", flush="sync").start()
    try:
        with AdminClient(b.address) as admin:
            admin.create_topic("sync", queues=queues)
        lats: list[float] = []
        with Producer(b.address) as p:
            for q in range(queues):  # every queue written once first: its files exist
                p.send(Message("sync", b"x" * 100), routing_key=f"warm{q}")
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t = time.perf_counter()
                p.send(Message("sync", b"x" * 100))
                lats.append((time.perf_counter() - t) * 1e3)
        return {"bench": "sync_sends", "queues": queues, "seconds": seconds, "sends_per_s": round(len(lats) / seconds, 1),
                **summary(lats, (0.5, 0.99, 0.999))}
    finally:
        b.stop()


def run_connections(tmp: Path, n: int) -> dict:
    """Idle TCP connections (connected, nothing sent) and idle client connections (one request
    each, then nothing): the broker's RSS growth per connection."""
    from equeue_core.client import AdminClient

    b = BrokerProcess(tmp / "data-conn", flush="async").start()
    socks: list[socket.socket] = []
    admins: list[AdminClient] = []
    try:
        pid = b.proc.pid
        rss0 = settled_rss_kb(pid)
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", b.port)))
        rss1 = settled_rss_kb(pid, 2.0)
        n_clients = min(n, 100)
        for _ in range(n_clients):
            a = AdminClient(b.address)
            a.broker_info()
            admins.append(a)
        rss2 = settled_rss_kb(pid, 2.0)
        return {"bench": "connections", "tcp_connections": n, "client_connections": n_clients,
                "rss_mb_start": round(rss0 / 1024, 1),
                "rss_kb_per_idle_tcp_connection": round((rss1 - rss0) / n, 2),
                "rss_kb_per_idle_client_connection": round((rss2 - rss1) / n_clients, 2)}
    finally:
        for a in admins:
            a.close()
        for s in socks:
            s.close()
        b.stop()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role"]:
        role, *rest = argv[1:]
        if role == "produce":
            out = role_produce(rest[0], rest[1].split(","), int(rest[2]), int(rest[3]))
        elif role == "consume":
            out = role_consume(rest[0], rest[1].split(","), int(rest[2]), rest[3], int(rest[4]),
                               rest[5:6] == ["pulling"])
        elif role == "consume_lite":
            out = role_consume_lite(rest[0], rest[1].split(","), int(rest[2]))
        elif role == "paced":
            out = role_paced(rest[0], rest[1].split(","), int(rest[2]), float(rest[3]))
        else:
            raise SystemExit(f"unknown role {role}")
        print(json.dumps(out))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100_000, help="messages per case")
    p.add_argument("--size", type=int, default=100, help="the produce and consume cases' message body, bytes")
    p.add_argument("--connections", type=int, default=500, help="idle TCP connections for the memory figure (0: skip it)")
    p.add_argument("--cases", help="comma list of queue counts to run (default 4,100,1000,100topics; "
                                   "none: only the paced, connection and sync figures)")
    p.add_argument("--sync-seconds", type=float, default=3.0,
                   help="flush=sync single sends over 4 and 1000 queues for this long each (0: skip)")
    p.add_argument("--paced-seconds", type=float, default=3.0,
                   help="send_async paced over 100 topics for this long (0: skip)")
    p.add_argument("--paced-rate", type=int, default=50_000, help="the paced case's msg/s")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the cases this many times, round after round, then one queues_ratio row per case")
    p.add_argument("--pull-in-handler-threads", action="store_true",
                   help="the push Consumer drains with pull_in_handler_threads=True (consumer_model: pulling)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    wanted = set(args.cases.split(",")) if args.cases else None
    with tempfile.TemporaryDirectory(prefix="equeue-bench-queues-") as tmp:
        rows = []
        cases = [case for case in CASES if not wanted or ("100topics" if case[1] > 1 else str(case[2])) in wanted]
        for r in range(args.rounds):
            for position, (label, n_topics, queues) in enumerate(round_cases(cases, r)):
                rows.append(run_case(Path(tmp), label, n_topics, queues, args.count, args.pull_in_handler_threads, r,
                                     args.size))
                rows[-1]["position"] = position
                emit(rows[-1])
        if args.rounds > 1:
            for row in ratio_rows(rows):
                emit(row)
        if args.paced_seconds > 0:
            emit(run_paced(Path(tmp), args.paced_rate, args.paced_seconds))
            emit(run_paced(Path(tmp), args.paced_rate, args.paced_seconds, warm=False))
        if args.connections > 0:
            emit(run_connections(Path(tmp), args.connections))
        if args.sync_seconds > 0:
            for queues in (4, 1000):
                emit(run_sync_sends(Path(tmp), queues, args.sync_seconds))


if __name__ == "__main__":
    main()
