"""CQRS benchmark: commands per second through equeue_cqrs, per event store plugin.

    .venv/bin/python -m bench.bench_cqrs                       # everything, default sizes
    .venv/bin/python -m bench.bench_cqrs --only inprocess --count 200000
    .venv/bin/python -m bench.bench_cqrs --only broker --processors 2 --store lmdb
    .venv/bin/python -m bench.bench_cqrs --only broker --profile   # py-spy (pip install py-spy) of a
                                                                   # processor, GIL holder only, to $TMPDIR

- inprocess: CommandEngine + event store, no broker: commands submitted from the benchmark's
  thread, timed until every command's events are persisted (mailboxes + event store alone).
- broker: a real broker process, 1 or 2 CommandProcessor processes in one consumer group, and
  sender processes using CommandBus.submit; timed from the first send until every result came
  back (so each command is sent, consumed, handled, persisted, its events published, its reply
  consumed). The RocksDB event store is owned by one process, so it runs with 1 processor only.
Each command appends one event to one of `--aggregates` counters. Event stores fsync every batch
unless --no-sync. One JSON line per result; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from equeue_cqrs import Aggregate, Command, CommandContext, DomainEvent, command_handler, event_handler  # noqa: E402
from equeue_cqrs.store import event_store_names, open_event_store  # noqa: E402

from tests.helpers.broker import BrokerProcess  # noqa: E402


class OpenCounter(Command):
    pass


class Increment(Command):
    by: int


class CounterOpened(DomainEvent):
    pass


class Incremented(DomainEvent):
    by: int


class Counter(Aggregate):
    value = 0

    @event_handler(CounterOpened)
    def _opened(self, e: CounterOpened) -> None:
        self.value = 0

    @event_handler(Incremented)
    def _incremented(self, e: Incremented) -> None:
        self.value += e.by


@command_handler
def open_counter(ctx: CommandContext, command: OpenCounter) -> None:
    counter = ctx.add(Counter(command.aggregate_id))
    counter.raise_event(CounterOpened())


@command_handler
def increment(ctx: CommandContext, command: Increment) -> None:
    ctx.get(Counter).raise_event(Incremented(command.by))


HANDLERS = [open_counter, increment]
PROFILE_PATH = os.path.join(tempfile.gettempdir(), "bench-cqrs-profile.txt")


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


def store_options(sync: bool) -> dict[str, str]:
    return {"sync": "true" if sync else "false"}


# ---------------------------------------------------------------- in process

def run_inprocess(store_name: str, count: int, aggregates: int, sync: bool, workers: int) -> dict:
    from equeue_cqrs import CommandEngine

    tmp = tempfile.mkdtemp(prefix="bench-cqrs-")
    store = open_event_store(store_name, os.path.join(tmp, "events"), store_options(sync))
    engine = CommandEngine(store, HANDLERS, workers=workers)
    try:
        def ignore(_result: object) -> None:
            pass

        for a in range(aggregates):
            engine.submit(OpenCounter(aggregate_id=f"c{a}"), ignore)
        engine.wait_idle(60)
        commands = [Increment(aggregate_id=f"c{i % aggregates}", by=1) for i in range(count)]
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(0, count, 64):  # as the processor does: a pulled batch at a time
            engine.submit_many([(c, ignore) for c in commands[i:i + 64]])
        ok = engine.wait_idle(600)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        total = sum(engine.load(Counter, f"c{a}").value for a in range(aggregates))
    finally:
        engine.close()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"bench": "cqrs", "mode": "inprocess", "store": store_name, "sync": sync, "workers": workers,
            "commands": count, "aggregates": aggregates, "complete": ok and total == count,
            "seconds": round(elapsed, 3), "commands_per_s": round(count / elapsed),
            "cpu_us_per_command": round(cpu / count * 1e6, 1)}


# ---------------------------------------------------------------- through the broker

def role_processor(address: str, store_name: str, path: str, sync: bool, workers: int) -> None:
    """Run a processor until SIGTERM; print its stats."""
    from equeue_cqrs import CommandProcessor

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    store = open_event_store(store_name, path, store_options(sync))
    processor = CommandProcessor(address, store, HANDLERS, workers=workers).start()
    print("ready", flush=True)
    while not stop:
        time.sleep(0.05)
    processor.close()
    store.close()
    emit({**processor.stats, "cpu_s": time.process_time()})


def role_sender(address: str, count: int, aggregates: int, first: int, go_at: float) -> None:
    from equeue_cqrs import CommandBus

    with CommandBus(address) as bus:
        commands = [Increment(aggregate_id=f"c{(first + i) % aggregates}", by=1) for i in range(count)]
        while time.time() < go_at:
            time.sleep(0.001)
        start = time.perf_counter()
        futures = [bus.submit(c) for c in commands]
        results = [f.result(600) for f in futures]
        elapsed = time.perf_counter() - start
    emit({"sent": count, "ok": sum(r.ok for r in results), "seconds": elapsed, "end": time.time(),
          "cpu_s": time.process_time()})


def run_broker(store_name: str, count: int, aggregates: int, sync: bool, processors: int, senders: int,
               workers: int, profile: bool) -> dict:
    from equeue_cqrs import CommandBus

    tmp = Path(tempfile.mkdtemp(prefix="bench-cqrs-"))
    broker = BrokerProcess(tmp / "broker").start()
    procs: list[subprocess.Popen] = []
    spy = None
    try:
        for _ in range(processors):
            p = subprocess.Popen([sys.executable, "-m", "bench.bench_cqrs", "--role", "processor", broker.address,
                                  store_name, str(tmp / "events"), str(int(sync)), str(workers)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        with CommandBus(broker.address) as bus:  # the counters exist before the timed part
            for f in [bus.submit(OpenCounter(aggregate_id=f"c{a}")) for a in range(aggregates)]:
                f.result(120)
            for f in [bus.submit(Increment(aggregate_id=f"c{a}", by=0)) for a in range(aggregates)]:
                f.result(120)  # and every processor holds its aggregates in memory
        if profile:
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(procs[0].pid), "--threads", "--format",
                                    "raw", "-o", PROFILE_PATH, "--rate", "200", "--gil"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        go_at = time.time() + 2.0
        per = count // senders
        runs = [subprocess.Popen([sys.executable, "-m", "bench.bench_cqrs", "--role", "sender", broker.address,
                                  str(per), str(aggregates), str(i * 7), str(go_at)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True) for i in range(senders)]
        outs = [json.loads(r.communicate(timeout=900)[0].strip().splitlines()[-1]) for r in runs]
        assert broker.proc is not None
        broker_cpu = _cpu_seconds(broker.proc.pid)
        elapsed = max(o["end"] for o in outs) - go_at
        ok = sum(o["ok"] for o in outs)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        stats = []
        for p in procs:
            p.send_signal(signal.SIGTERM)
            out = p.communicate(timeout=120)[0]
            stats.append(json.loads(out.strip().splitlines()[-1]) if out.strip() else {})
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"bench": "cqrs", "mode": "broker", "store": store_name, "sync": sync, "processors": processors,
            "workers": workers,
            "senders": senders, "commands": per * senders, "ok": ok, "aggregates": aggregates,
            "seconds": round(elapsed, 3), "commands_per_s": round(per * senders / elapsed),
            "conflicts": sum(s.get("conflicts", 0) for s in stats),
            # CPU per command by process kind (whole run, set-up included): what the commands cost
            # independently of how many other jobs share the machine's cores
            "cpu_us_per_command": {"processors": round(sum(s.get("cpu_s", 0) for s in stats) / count * 1e6),
                                   "senders": round(sum(o["cpu_s"] for o in outs) / count * 1e6),
                                   "broker": round(broker_cpu / count * 1e6)}}


def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=["inprocess", "broker"])
    ap.add_argument("--store", choices=event_store_names())
    ap.add_argument("--count", type=int, default=0, help="commands (default 100000 in process, 40000 broker)")
    ap.add_argument("--aggregates", type=int, default=1000)
    ap.add_argument("--processors", type=int, choices=[1, 2])
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-sync", action="store_true", help="event store writes without fsync")
    ap.add_argument("--profile", action="store_true", help="py-spy the first processor (bench-cqrs-profile.txt)")
    args = ap.parse_args()
    if args.role:
        role, *rest = args.role
        if role == "processor":
            role_processor(rest[0], rest[1], rest[2], rest[3] == "1", int(rest[4]))
        else:
            role_sender(rest[0], int(rest[1]), int(rest[2]), int(rest[3]), float(rest[4]))
        return 0
    stores = [args.store] if args.store else event_store_names()
    sync = not args.no_sync
    if args.only in (None, "inprocess"):
        for name in stores:
            emit(run_inprocess(name, args.count or 100_000, args.aggregates, sync, args.workers))
    if args.only in (None, "broker"):
        for name in stores:
            for n in [args.processors] if args.processors else [1, 2]:
                if n > 1 and name == "rocksdb":
                    continue  # one process owns a RocksDB directory
                emit(run_broker(name, args.count or 40_000, args.aggregates, sync, n, args.senders,
                                args.workers, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
