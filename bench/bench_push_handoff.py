"""Where a push Consumer's end-to-end time goes at a paced rate: from the send to the pull answer
reaching the handler pool (`sent->submit`), and from there to the handler (`submit->handler`).

A broker process (file store, tcp, flush async), a topic of 4 queues, a sender process calling
`send` at a steady rate (sleeping between sends), and a push Consumer in this process whose
handler notes the time. The split point is HandlerPool.submit, timed by wrapping it in this
process (a probe, not a change to the client). Prints one JSON line per --threads value, with
p50/p90/p99/max in ms of each part and of the whole, and this process's CPU and context switches
per message (`consumer_cpu_us_per_msg`, `consumer_switches_per_msg`, from getrusage), and of it
the client loop thread's CPU (`consumer_loop_thread_cpu_us_per_msg`, from the thread's schedstat;
the rest is the handler threads').
`--models loop,pulling` runs each --threads value with the default Consumer (`loop`: pulls on
the loop thread, a worker pool) and with `pull_in_handler_threads=True` (`pulling`: no hand-off,
so only the whole end-to-end time is split off; `model` in each line says which).

Where the slow messages come from, in the same line:
- `slow`: messages over 1 ms end to end (`over_1ms`), the episodes they came in and the largest
  (bench/peers/common.py `slow_summary`), and `episode_period_ms`, the median time between the
  starts of episodes of at least 5 messages (a stall that recurs on a clock shows as its period).
- `consumer_loop`: a 1 ms timer on the client's loop thread; `stalls_over_2ms` counts the turns
  it ran more than 2 ms late (the consumer process did not run), `worst_ms` how late the worst was.
- `consumer_gc`: the consumer process's garbage collections during the run and the longest.
- `sender`: how late the paced sender stamped its messages after their slots (`late_p99_ms`,
  `late_max_ms`: `send` waits for each answer, so a slow send or a sleep that overslept
  delays the sends behind it), and each `send` call's own time (`send_p50_ms` ... `send_max_ms`,
  `sends_over_2ms`).

    .venv/bin/python -m bench.bench_push_handoff                     # 10k messages at 5k/s, threads 1 and 8
    .venv/bin/python -m bench.bench_push_handoff --threads 1,2,4,8 --count 20000
    .venv/bin/python -m bench.bench_push_handoff --threads 8 --models loop,pulling --count 20000

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.child import role_result  # noqa: E402
from bench.gc_pauses import GcPauses  # noqa: E402
from bench.peers.common import (  # noqa: E402
    SLOW_MS,
    episodes,
    paced,
    slow_summary,
    stamp,
    summary,
)
from bench.thread_cpu import thread_cpu_s  # noqa: E402
from equeue_core.client.loop import LOOP_THREAD_NAME  # noqa: E402
from tests.helpers.broker import BrokerProcess  # noqa: E402


def percentiles(xs: list[float]) -> dict:
    return summary(xs, (0.5, 0.9, 0.99))


def role_send(address: str, count: int, rate: int) -> None:
    """The paced sender; prints one JSON line: how late it stamped after each slot, and its sends."""
    from equeue_core.client import Message, Producer

    late: list[float] = []
    took: list[float] = []

    def send(i: int, due: int) -> None:
        body = stamp(100, due)
        started = time.time_ns()
        p.send(Message("handoff", body))
        late.append((int.from_bytes(body[:8], "little") - due) / 1e6)
        took.append((time.time_ns() - started) / 1e6)

    with Producer(address) as p:
        paced(count, rate, False, send)
    lateness = summary(late)
    print(json.dumps({"late_p99_ms": lateness["p99_ms"], "late_max_ms": lateness["max_ms"],
                      **{f"send_{k}": v for k, v in summary(took, (0.5, 0.99, 0.999)).items() if k != "count"},
                      "sends_over_2ms": sum(1 for t in took if t > 2)}), flush=True)


class LoopStalls:
    """A 1 ms timer on `loop`: the turns it ran more than 2 ms late (the process did not run)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.late_ms: list[float] = []
        self._task = asyncio.run_coroutine_threadsafe(self._tick(), loop)

    async def _tick(self) -> None:
        due = time.perf_counter()
        while True:
            due += 0.001
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            late = time.perf_counter() - due
            if late > 0.002:
                self.late_ms.append(late * 1e3)
                due = time.perf_counter()

    def stop(self) -> dict:
        self._task.cancel()
        return {"stalls_over_2ms": len(self.late_ms), "worst_ms": round(max(self.late_ms, default=0.0), 2)}


def slow_messages(seen: list[tuple[int, int, int, int]]) -> dict:
    """`slow_summary` of the messages over SLOW_MS end to end, and `episode_period_ms`: the median
    time between the starts of episodes of at least 5 messages (None with fewer than two)."""
    slow = [s for s, h, _, _ in seen if (h - s) / 1e6 > SLOW_MS]
    starts = [start for start, size in episodes(slow) if size >= 5]
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(starts)]
    return {**slow_summary(slow), "episode_period_ms": round(statistics.median(gaps), 1) if gaps else None}


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
    from equeue_core.client.loop import background_loop

    # The bookkeeping is kept in arrays, not tuples: a tracked object per message would make this
    # process's garbage collector run (and scan them) far more often than the consumer's own does.
    submitted = [array("q") for _ in range(4)]  # queue id, first offset, ns, records
    real_submit = handler_pool.HandlerPool.submit

    def submit(self, pq, msgs):
        for column, v in zip(submitted, (pq.queue_id, msgs.offset_at(0), time.time_ns(), len(msgs)), strict=True):
            column.append(v)
        return real_submit(self, pq, msgs)

    columns = [array("q") for _ in range(4)]  # sent ns, handled ns, queue id, offset
    lock = threading.Lock()
    done = threading.Event()

    def handler(m) -> None:
        now = time.time_ns()
        with lock:
            for column, v in zip(columns, (int.from_bytes(m.body[:8], "little"), now, m.queue_id, m.queue_offset),
                                 strict=True):
                column.append(v)
            if len(columns[0]) >= count:
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
        loop_cpu = thread_cpu_s(LOOP_THREAD_NAME)
        stalls, pauses = LoopStalls(background_loop()), GcPauses()
        try:
            sender = role_result([sys.executable, "-m", "bench.bench_push_handoff", "--role-send", address,
                                  str(count), str(rate)], what="sender", cwd=ROOT, timeout=count / rate + 120)
            done.wait(30)
        finally:
            loop_stalls, gc_pauses = stalls.stop(), pauses.stop()
        after = resource.getrusage(resource.RUSAGE_SELF)
        loop_cpu = thread_cpu_s(LOOP_THREAD_NAME) - loop_cpu
        c.close()
    finally:
        handler_pool.HandlerPool.submit = real_submit
    seen = list(zip(*columns, strict=True))
    at: dict[tuple[int, int], int] = {}
    for q, first, ns, n in zip(*submitted, strict=True):
        for off in range(first, first + n):
            at[(q, off)] = ns
    row = {"bench": "push_handoff", "model": model, "threads": threads, "rate": rate, "count": len(seen),
           **_process_cost(before, after, len(seen)),
           "consumer_loop_thread_cpu_us_per_msg": round(loop_cpu / max(1, len(seen)) * 1e6, 1),
           "end_to_end": percentiles([(h - s) / 1e6 for s, h, _, _ in seen]), "slow": slow_messages(seen),
           "consumer_loop": loop_stalls, "consumer_gc": gc_pauses, "sender": sender}
    if pulling:
        return row
    timed = [(s, h, at[(q, o)]) for s, h, q, o in seen if (q, o) in at]
    return {**row, "records_per_batch": round(len(seen) / max(1, len(submitted[0])), 2),
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

    with tempfile.TemporaryDirectory(prefix="equeue-bench-handoff-") as tmp, \
            BrokerProcess(Path(tmp) / "data", flush="async") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("handoff", queues=4)
        runs = [(int(t), m) for t in args.threads.split(",") for m in models]
        for i, (threads, model) in enumerate(runs):
            print(json.dumps(run(b.address, str(Path(tmp) / f"offsets-{i}"), f"g{i}", args.count, args.rate,
                                 threads, model)), flush=True)


if __name__ == "__main__":
    main()
