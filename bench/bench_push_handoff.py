"""Where a push Consumer's end-to-end time goes at a paced rate: from the send to the pull answer
reaching the handler pool (`sent->submit`), and from there to the handler (`submit->handler`).

A broker process (file store, tcp, flush async), a topic of 4 queues, a sender process calling
`send` at a steady rate (sleeping between sends), and a push Consumer in this process whose
handler notes the time. The split point is HandlerPool.submit, timed by wrapping it in this
process (a probe, not a change to the client). Prints one JSON line per --threads value, with
p50/p90/p99/max in ms of each part and of the whole, and this process's CPU and context switches
per message (`consumer_cpu_us_per_msg`, `consumer_switches_per_msg`, from getrusage).
`--models loop,pulling` runs each --threads value with the default Consumer (`loop`: pulls on
the loop thread, a worker pool) and with `pull_in_handler_threads=True` (`pulling`: no hand-off,
so only the whole end-to-end time is split off; `model` in each line says which).

    .venv/bin/python -m bench.bench_push_handoff                     # 10k messages at 5k/s, threads 1 and 8
    .venv/bin/python -m bench.bench_push_handoff --threads 1,2,4,8 --count 20000
    .venv/bin/python -m bench.bench_push_handoff --threads 8 --models loop,pulling --count 20000

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peers.common import paced, stamp, summary  # noqa: E402
from tests.helpers.broker import BrokerProcess  # noqa: E402


def percentiles(xs: list[float]) -> dict:
    return summary(xs, (0.5, 0.9, 0.99))


def role_send(address: str, count: int, rate: int) -> None:
    from equeue_core.client import Message, Producer

    with Producer(address) as p:
        paced(count, rate, False, lambda i, due: p.send(Message("handoff", stamp(100, due))))


def _process_cost(before: resource.struct_rusage, after: resource.struct_rusage, n: int) -> dict:
    """This process's CPU and context switches (all its threads: the client loop and the
    handler workers) per message handled while the sender ran."""
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    switches = (after.ru_nvcsw + after.ru_nivcsw) - (before.ru_nvcsw + before.ru_nivcsw)
    return {"consumer_cpu_us_per_msg": round(cpu / max(1, n) * 1e6, 1),
            "consumer_switches_per_msg": round(switches / max(1, n), 2)}


def run(address: str, offset_dir: str, group: str, count: int, rate: int, threads: int,
        model: str = "loop") -> dict:
    from equeue_core.client import Consumer, handler_pool

    submitted: dict[tuple[int, int], int] = {}  # (queue id, first offset) -> (ns, records)
    real_submit = handler_pool.HandlerPool.submit

    def submit(self, pq, msgs):
        submitted[(pq.queue_id, msgs.offset_at(0))] = (time.time_ns(), len(msgs))
        return real_submit(self, pq, msgs)

    seen: list[tuple[int, int, int, int]] = []  # (sent ns, handled ns, queue id, offset)
    lock = threading.Lock()
    done = threading.Event()

    def handler(m) -> None:
        now = time.time_ns()
        with lock:
            seen.append((int.from_bytes(m.body[:8], "little"), now, m.queue_id, m.queue_offset))
            if len(seen) >= count:
                done.set()

    pulling = model == "pulling"
    if not pulling:
        handler_pool.HandlerPool.submit = submit
    try:
        options = {"pull_in_handler_threads": True} if pulling else {"offset_dir": offset_dir}
        c = Consumer(group, address, consume_from="last", threads=threads, **options)
        c.subscribe("handoff")
        c.start(handler)
        deadline = time.monotonic() + 30
        while not c.assigned_queues() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        before = resource.getrusage(resource.RUSAGE_SELF)
        sender = subprocess.run([sys.executable, "-m", "bench.bench_push_handoff", "--role-send", address,
                                 str(count), str(rate)], cwd=ROOT, timeout=count / rate + 120)
        done.wait(30)
        after = resource.getrusage(resource.RUSAGE_SELF)
        c.close()
    finally:
        handler_pool.HandlerPool.submit = real_submit
    at: dict[tuple[int, int], int] = {}
    for (q, first), (ns, n) in submitted.items():
        for off in range(first, first + n):
            at[(q, off)] = ns
    row = {"bench": "push_handoff", "model": model, "threads": threads, "rate": rate, "count": len(seen),
           "sender_rc": sender.returncode, **_process_cost(before, after, len(seen)),
           "end_to_end": percentiles([(h - s) / 1e6 for s, h, _, _ in seen])}
    if pulling:
        return row
    timed = [(s, h, at[(q, o)]) for s, h, q, o in seen if (q, o) in at]
    return {**row, "records_per_batch": round(len(seen) / max(1, len(submitted)), 2),
            "sent_to_submit": percentiles([(b - s) / 1e6 for s, _, b in timed]),
            "submit_to_handler": percentiles([(h - b) / 1e6 for _, h, b in timed])}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role-send"]:
        role_send(argv[1], int(argv[2]), int(argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--threads", default="1,8", help="comma list of Consumer threads= values")
    ap.add_argument("--models", default="loop", help="comma list of loop (default Consumer) and pulling "
                    "(pull_in_handler_threads=True)")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if not set(models) <= {"loop", "pulling"}:
        ap.error(f"--models takes loop and pulling, not {args.models!r}")
    from equeue_core.client import AdminClient

    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp) / "data", flush="async") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("handoff", queues=4)
        runs = [(int(t), m) for t in args.threads.split(",") for m in models]
        for i, (threads, model) in enumerate(runs):
            print(json.dumps(run(b.address, str(Path(tmp) / f"offsets-{i}"), f"g{i}", args.count, args.rate,
                                 threads, model)), flush=True)


if __name__ == "__main__":
    main()
