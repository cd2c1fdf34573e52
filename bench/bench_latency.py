"""Latency and hot-path benchmarks: end-to-end latency at a paced rate, single sends, a caller that
spins between sends, and cost against queue count; broker memory per idle connection and per queue.

Every measurement runs a real broker process and a real client process on 127.0.0.1 and prints one
JSON line. `--baseline DIR` runs every measurement a second time, in the same run and alternating
with the current code, with the broker and the client imported from DIR (a tree holding
`equeue_core/` and `equeue_plugins/`, e.g. made with
`git archive <commit> equeue_core plugins | tar -x -C DIR && mv DIR/plugins DIR/equeue_plugins`),
so old and new are compared on the same noisy machine.

    .venv/bin/python -m bench.bench_latency                       # everything
    .venv/bin/python -m bench.bench_latency --only e2e,spin --rate 5000 --seconds 5
    .venv/bin/python -m bench.bench_latency --only single --baseline /tmp/latency-base
    .venv/bin/python -m bench.bench_latency --only scan,memory

Cases (`--only`):
- e2e: one process sends at a steady `--rate` (sleeping until each message is due), another
  consumes the topic (as bench/peers runs it: a LitePullConsumer polling; `--receiver push` or
  `lite,push` for the push Consumer); latency: send time (wall clock, in the body) to poll's
  return (or the handler call), and (due_*) from the message's slot in the pace, which also
  counts the time a message waited for a sender held up by the one before it
  (bench/peers/common.py). Once with `send` (waits for each acknowledgement), once with `send_async`. CPU
  per message of each process (sleeping sender only) says what the rate costs.
- spin: the same, but the caller busy-waits until each message is due and never sleeps (an app that
  computes between sends): the client must deliver without idle time in the caller's thread.
- single: `send` one at a time, as fast as it goes (async flush, and sync flush).
- produce: `send_async` as fast as it goes (that adaptive batching keeps its throughput).
- scan: produce (`send_async`) and consume (one consumer, default pull batch; from the first message
  handled, and with the consumer's start) rates for a topic of 4, 100 and 1000 queues and for 100
  topics of 4 queues.
- memory: broker RSS growth per idle client connection and per queue (1000-queue topics created,
  8 messages a queue).

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # tests.helpers; appended so a --baseline tree's equeue_core wins

from bench.answer_window import AnswerWindow  # noqa: E402  (after the path: a --baseline role imports it too)
from bench.child import role_result  # noqa: E402
from bench.peers.common import Latencies, paced, stamp, tree_cpu_seconds  # noqa: E402


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- client roles (child processes)

def role_receiver(address: str, topic: str, count: int, group: str, kind: str = "push") -> dict:
    """The consuming side of e2e/spin, in its own process: latency = handler call (push
    Consumer) or poll's return (LitePullConsumer, `kind` "lite") - send time (both wall clock,
    same machine). Prints `ready` once its queues are assigned."""
    from equeue_core.client import Consumer, Message, Producer

    if kind == "lite":
        return _lite_receiver(address, topic, count, group)

    lat = Latencies()
    lock = threading.Lock()
    all_in = threading.Event()

    def handler(m) -> None:
        now = time.time_ns()  # before the lock, which other handler threads may hold
        with lock:
            if lat.add(m.body, now) and len(lat) >= count:
                all_in.set()

    with Producer(address) as p:
        p.send(Message(topic, b"\0" * 100))  # the topic exists before the consumer subscribes
    c = Consumer(group, address, consume_from="last").subscribe(topic)
    c.start(handler)
    time.sleep(1.0)
    print("ready", flush=True)
    cpu0 = time.process_time()
    all_in.wait(120)
    cpu = time.process_time() - cpu0
    c.close()
    with lock:
        return {**lat.summary(), "receiver_cpu_us_per_msg": cpu * 1e6 / max(1, len(lat))}


def _lite_receiver(address: str, topic: str, count: int, group: str) -> dict:
    from equeue_core.client import Message, Producer

    try:
        from equeue_core.client import LitePullConsumer
    except ImportError:
        raise SystemExit("this tree has no LitePullConsumer: run it with --receiver push") from None
    with Producer(address) as p:
        p.send(Message(topic, b"\0" * 100))
    lat = Latencies()
    c = LitePullConsumer(group, address, consume_from="last")
    c.subscribe(topic)
    c.poll(0.2)
    print("ready", flush=True)
    cpu0 = time.process_time()
    deadline = time.monotonic() + 120
    while len(lat) < count and time.monotonic() < deadline:
        for m in c.poll(1.0):
            lat.add(m.body)
    cpu = time.process_time() - cpu0
    c.close()
    return {**lat.summary(), "receiver_cpu_us_per_msg": cpu * 1e6 / max(1, len(lat))}


def role_sender(address: str, topic: str, rate: int, seconds: float, mode: str, pacing: str) -> dict:
    """Paced sends: sleeping until each message is due, or spinning (never idle)."""
    from equeue_core.client import Message, Producer

    n = int(rate * seconds)
    with Producer(address) as p:
        p.send(Message(topic, b"\0" * 100))
        send = p.send if mode == "send" else p.send_async
        cpu0 = time.process_time()
        row = paced(n, rate, pacing == "spin", lambda i, due: send(Message(topic, stamp(100, due))))
        p.flush()
        cpu = time.process_time() - cpu0
        lane = getattr(p, "lane_frames", None)  # None: a --baseline tree without the lane
    return {"sent": n, "achieved_rate": row["msgs_per_s"], "lane_frames": lane,
            "sender_cpu_us_per_msg": cpu * 1e6 / n if pacing == "sleep" else None}


def role_single(address: str, topic: str, count: int, size: int) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(address) as p:
        for _ in range(200):
            p.send(Message(topic, body))  # route lookup, connection and loop warm-up
        start = time.perf_counter()
        for _ in range(count):
            p.send(Message(topic, body))
        elapsed = time.perf_counter() - start
    return {"count": count, "msgs_per_s": count / elapsed, "us_per_send": elapsed / count * 1e6}


def role_produce(address: str, topic: str, count: int, size: int) -> dict:
    """`send_async` as fast as the caller goes (the auto batching's throughput)."""
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(address) as p:
        p.send(Message(topic, body))
        cpu0 = time.process_time()
        start = time.perf_counter()
        window = AnswerWindow()
        for _ in range(count):
            window.add(p.send_async(Message(topic, body)))
        window.drain()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    return {"count": count, "msgs_per_s": count / elapsed, "cpu_us_per_msg": cpu * 1e6 / count}


def role_scan(address: str, topics: int, queues: int, count: int) -> dict:
    """Produce `count` messages spread over `topics` topics of `queues` queues, then consume them
    with one consumer subscribed to all of them."""
    from equeue_core.client import AdminClient, Consumer, Message, Producer

    names = [f"scan-{topics}x{queues}-{i}" for i in range(topics)]
    with AdminClient(address) as admin:
        for t in names:
            admin.create_topic(t, queues)
    body = b"x" * 100
    with Producer(address) as p:
        for t in names:
            p.send(Message(t, body))
        start = time.perf_counter()
        window = AnswerWindow()
        for i in range(count):
            window.add(p.send_async(Message(names[i % topics], body)))
        window.drain()
        produce_s = time.perf_counter() - start
    total = count + topics
    seen = 0
    first = 0.0
    lock = threading.Lock()
    done = threading.Event()

    def handler(m) -> None:
        nonlocal seen, first
        with lock:
            if not seen:
                first = time.perf_counter()
            seen += 1
            if seen >= total:
                done.set()

    c = Consumer("scan", address, consume_from="first")
    for t in names:
        c.subscribe(t)
    start = time.perf_counter()
    c.start(handler)
    started_s = time.perf_counter() - start
    done.wait(300)
    end = time.perf_counter()
    c.close()
    return {"count": count, "produce_msgs_per_s": count / produce_s, "consumed": seen,
            "consume_start_s": started_s, "consume_msgs_per_s": seen / (end - first),
            "consume_msgs_per_s_incl_start": seen / (end - start)}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def role_memory(address: str, broker_pid: int, connections: int, queues: int) -> dict:
    """RSS growth of the broker per idle connection (each made one request, then idles) and per
    queue (1000-queue topics created, about 8 messages stored in every queue)."""
    from equeue_core import frame as wire
    from equeue_core.client import AdminClient, Message, Producer
    from equeue_core.codes import Code

    host, port = address.split("://")[-1].rsplit(":", 1)
    time.sleep(0.5)
    base = rss_kib(broker_pid)
    socks = []
    ping = wire.encode_bytes(wire.Frame(int(Code.BROKER_INFO), 1))
    for _ in range(connections):
        s = socket.create_connection((host, int(port)))
        s.sendall(ping)
        s.recv(65536)
        socks.append(s)
    time.sleep(1.0)
    with_conns = rss_kib(broker_pid)
    for s in socks:
        s.close()
    time.sleep(0.5)
    per_topic = 1000
    before_q = rss_kib(broker_pid)
    with AdminClient(address) as admin, Producer(address) as p:
        for t in range(max(1, queues // per_topic)):
            name = f"mem-{t}"
            admin.create_topic(name, per_topic)
            # routing keys hash over the queues: 8 keys a queue leave ~0.3 of 1000 queues empty
            futs = [p.send_async(Message(name, b"x" * 100), routing_key=str(k)) for k in range(8 * per_topic)]
            filled = {f.result().queue_id for f in futs}
    time.sleep(1.0)
    after_q = rss_kib(broker_pid)
    nq = max(1, queues // per_topic) * per_topic
    return {"rss_idle_kib": base, "connections": connections,
            "kib_per_idle_connection": (with_conns - base) / connections,
            "queues": nq, "queues_filled_last_topic": len(filled), "messages": 8 * nq,
            "kib_per_queue": (after_q - before_q) / nq}


# ---------------------------------------------------------------- orchestration

def _child(code: Path, args: list[str], timeout: float = 900) -> dict:
    """Run a role of this module in its own process, importing equeue from `code`."""
    env = dict(os.environ, PYTHONPATH=str(code))
    return role_result([sys.executable, str(Path(__file__).resolve()), "--role", *args], what=f"role {args[0]}",
                       cwd=code, timeout=timeout, env=env)


def _e2e(code: Path, address: str, topic: str, rate: int, seconds: float, mode: str, pacing: str,
         receiver: str = "lite") -> dict:
    """A receiver process and a sender process (as the peers benchmark runs them)."""
    env = dict(os.environ, PYTHONPATH=str(code))
    n = int(rate * seconds)
    recv = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--role", "receiver", address, topic,
                             str(n), f"g-{topic}", receiver], cwd=code, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError("receiver did not start")
        sender = _child(code, ["sender", address, topic, str(rate), str(seconds), mode, pacing])
        out, _ = recv.communicate(timeout=180)
        return {**sender, **json.loads(out.strip().splitlines()[-1])}
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def _broker(code: Path, data: Path, flush: str = "async"):
    from tests.helpers.broker import BrokerProcess

    return BrokerProcess(data, flush=flush, prefix=["env", "-C", str(code), f"PYTHONPATH={code}"]).start()


def run(args: argparse.Namespace) -> None:
    only = set(args.only.split(",")) if args.only else {"e2e", "spin", "single", "produce", "scan", "memory"}
    codes = [("new", ROOT)] + ([("base", Path(args.baseline).resolve())] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="equeue-bench-lat-") as tmp:
        run_no = 0

        def fresh(code: Path, flush: str = "async"):
            nonlocal run_no
            run_no += 1
            return _broker(code, Path(tmp) / f"d{run_no}", flush)

        for rnd in range(args.rounds):
            for label, code in codes:
                b = fresh(code)
                try:
                    for mode, pacing, case in (("send", "sleep", "e2e"), ("async", "sleep", "e2e"),
                                               ("send", "spin", "spin"), ("async", "spin", "spin")):
                        if case in only:
                            for receiver in args.receiver.split(","):
                                cpu0 = tree_cpu_seconds(b.proc.pid)
                                res = _e2e(code, b.address, f"lat-{mode}-{pacing}-{receiver}", args.rate,
                                           args.seconds, mode, pacing, receiver)
                                cpu = tree_cpu_seconds(b.proc.pid)
                                # the broker's CPU during the row (receiver and sender start-up included)
                                res["broker_cpu_us_per_msg"] = (
                                    None if cpu0 is None or cpu is None or not res.get("sent")
                                    else round((cpu - cpu0) * 1e6 / res["sent"], 1))
                                emit({"bench": case, "code": label, "round": rnd, "rate": args.rate, "mode": mode,
                                      "pacing": pacing, "receiver": receiver, **res})
                    if "single" in only:
                        for size in (100, 1024):
                            res = _child(code, ["single", b.address, f"single-{size}", str(args.single_count),
                                                str(size)])
                            emit({"bench": "single", "code": label, "round": rnd, "flush": "async", "size": size,
                                  **res})
                    if "produce" in only:
                        res = _child(code, ["produce", b.address, "produce-100", str(args.scan_count), "100"])
                        emit({"bench": "produce", "code": label, "round": rnd, "mode": "send_async", "size": 100,
                              **res})
                finally:
                    b.stop()
                if "single" in only:
                    b = fresh(code, "sync")
                    try:
                        res = _child(code, ["single", b.address, "single-sync", str(args.single_count // 4), "100"])
                        emit({"bench": "single", "code": label, "round": rnd, "flush": "sync", "size": 100, **res})
                    finally:
                        b.stop()
                if "scan" in only:
                    for topics, queues in ((1, 4), (1, 100), (1, 1000), (100, 4)):
                        b = fresh(code)
                        try:
                            res = _child(code, ["scan", b.address, str(topics), str(queues), str(args.scan_count)])
                            emit({"bench": "scan", "code": label, "round": rnd, "topics": topics,
                                  "queues_per_topic": queues, **res})
                        finally:
                            b.stop()
                if "memory" in only:
                    b = fresh(code)
                    try:
                        assert b.proc is not None
                        res = _child(code, ["memory", b.address, str(b.proc.pid), "500", "4000"])
                        emit({"bench": "memory", "code": label, "round": rnd, **res})
                    finally:
                        b.stop()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role"]:
        role, *rest = argv[1:]
        if role == "sender":
            out = role_sender(rest[0], rest[1], int(rest[2]), float(rest[3]), rest[4], rest[5])
        elif role == "receiver":
            out = role_receiver(rest[0], rest[1], int(rest[2]), rest[3], *rest[4:5])
        elif role == "single":
            out = role_single(rest[0], rest[1], int(rest[2]), int(rest[3]))
        elif role == "produce":
            out = role_produce(rest[0], rest[1], int(rest[2]), int(rest[3]))
        elif role == "scan":
            out = role_scan(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        elif role == "memory":
            out = role_memory(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        else:
            raise SystemExit(f"unknown role {role}")
        print(json.dumps(out))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma list of e2e,spin,single,produce,scan,memory")
    p.add_argument("--rate", type=int, default=5000, help="messages/s of the paced cases")
    p.add_argument("--seconds", type=float, default=5.0, help="length of a paced case")
    p.add_argument("--single-count", type=int, default=20000)
    p.add_argument("--scan-count", type=int, default=100000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--receiver", default="lite",
                   help="e2e/spin receivers, comma list of lite (LitePullConsumer.poll) and push (Consumer "
                        "with a handler); a --baseline tree older than the LitePullConsumer needs push")
    p.add_argument("--baseline", help="a tree with equeue_core/ and equeue_plugins/ to compare with")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
