"""Per-record CPU cost of the record hot path, Python against native in the same run (not a test):

    .venv/bin/python -m bench.bench_record [--records 32] [--sizes 100,1024] [--rounds 5]
    .venv/bin/python -m bench.bench_record --broker [--count 100000] [--rounds 3]

For each body size, a batch of --records records goes through what the broker does per producer
batch (scan with the topic and body checks, stamp_batch with its crc, index_entries), what a
verified read does (damage per record; crc_spans for the whole batch) and what the consumer does
(client decode_batch), and the producer's encode_record per message. Both implementations alternate round by round; the best round's CPU time
(time.process_time) per record is printed as one JSON line per function and size, with the ratio.

--broker: a real broker process (file store, tcp, flush=async) per implementation and round
(EQUEUE_PURE_PYTHON=1 for "python", in the broker and the client alike), alternating: produce
--count messages with send_batch of 1000 (100 B, then 1 KiB), then drain them with one Consumer at
its defaults; CPU per message of the broker (/proc/<pid>/stat utime+stime) and of the client
process (time.process_time), best round kept. CPU, not wall time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from equeue_core import record
from equeue_core.client import message


def _batch(n: int, size: int) -> bytearray:
    return bytearray(b"".join(record.encode_record("bench", b"x" * size, "tag", ["k1"], None) for _ in range(n)))


def _cases(impl: dict, template: bytearray, reps: int) -> dict:
    """Function name -> a callable running it reps times over copies of the batch."""
    starts = record.PYTHON_FUNCTIONS["scan"](template)
    positions = [1000 + s for s in starts]
    stamped = bytearray(template)
    record.PYTHON_FUNCTIONS["stamp_batch"](stamped, starts, positions, 0, 1, 1)
    frozen = bytes(stamped)
    sizes = [record.record_size(frozen, s) for s in starts]
    ends = [s + z for s, z in zip(starts, sizes, strict=True)]
    crc_from = [s + record.CRC_FROM for s in starts]
    copies = [bytearray(template) for _ in range(reps)]
    scan, stamp, entries = impl["scan"], impl["stamp_batch"], impl["index_entries"]
    damage, spans, decode = impl["damage"], impl["crc_spans"], impl["decode_batch"]
    encode = impl["encode_record"]
    body = record.decode(frozen, 0).body

    def run_scan() -> None:
        for _ in range(reps):
            scan(frozen, topic=b"bench", max_body=4 * 1024 * 1024)

    def run_stamp() -> None:
        for b in copies:
            stamp(b, starts, positions, 0, 1, 1)

    def run_entries() -> None:
        for _ in range(reps):
            entries(frozen, starts, positions)

    def run_damage() -> None:
        for _ in range(reps):
            for s, z, p in zip(starts, sizes, positions, strict=True):
                damage(frozen, s, z, p)

    def run_spans() -> None:
        for _ in range(reps):
            spans(frozen, crc_from, ends)

    def run_decode() -> None:
        for _ in range(reps):
            decode(frozen, "C0A80001")

    def run_encode() -> None:
        for _ in range(reps):
            for _ in starts:
                encode("bench", body, "tag", ["k1"], None)

    return {"encode_record": run_encode, "scan": run_scan, "stamp_batch": run_stamp, "index_entries": run_entries, "damage": run_damage,
            "crc_spans": run_spans, "decode_batch": run_decode}


def _proc_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_child(count: int) -> None:
    """One round in this process (its implementation chosen by the environment): JSON on stdout."""
    import tempfile
    from pathlib import Path

    from equeue_core.client import Consumer, Message, Producer
    from tests.helpers.broker import BrokerProcess
    from tests.helpers.counting import CountingHandler

    out = {"implementation": record.IMPLEMENTATION}
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(Path(tmp) / "b", store="file", transport="tcp", flush="async").start()
        try:
            with Producer(b.address) as p:
                for size in (100, 1024):
                    topic = f"t{size}"
                    msgs = [Message(topic, os.urandom(size)) for _ in range(1000)]
                    p.send_batch(msgs[:10])
                    c0, s0 = _proc_cpu(b.proc.pid), time.process_time()
                    for _ in range(count // 1000):
                        p.send_batch(msgs)
                    n = count // 1000 * 1000
                    out[f"produce_{size}_broker_us"] = (_proc_cpu(b.proc.pid) - c0) * 1e6 / n
                    out[f"produce_{size}_client_us"] = (time.process_time() - s0) * 1e6 / n
            total = count // 1000 * 1000 + 10
            handler = CountingHandler(total)
            c = Consumer("drain", b.address, consume_from="first", offset_dir=str(Path(tmp) / "offsets"))
            c.subscribe("t100")
            c0, s0 = _proc_cpu(b.proc.pid), time.process_time()
            c.start(handler)
            handler.done.wait(600)
            out["consume_100_broker_us"] = (_proc_cpu(b.proc.pid) - c0) * 1e6 / handler.seen
            out["consume_100_client_us"] = (time.process_time() - s0) * 1e6 / handler.seen
            c.close()
        finally:
            b.stop()
    print(json.dumps(out), flush=True)


def broker_rounds(count: int, rounds: int) -> None:
    import subprocess
    import sys

    best: dict[str, dict[str, float]] = {"python": {}, "native": {}}
    for _ in range(rounds):
        for mode in ("native", "python"):
            env = dict(os.environ, EQUEUE_PURE_PYTHON="1" if mode == "python" else "0")
            run = subprocess.run([sys.executable, "-m", "bench.bench_record", "--broker-child", "--count", str(count)],
                                 env=env, capture_output=True, text=True, timeout=1800, check=True)
            row = json.loads(run.stdout.strip().splitlines()[-1])
            assert row.pop("implementation").startswith(mode), (mode, row)
            for k, v in row.items():
                best[mode][k] = min(best[mode].get(k, v), v)
    for k in best["python"]:
        r = {"bench": "record_broker", "measure": k, "python": round(best["python"][k], 2)}
        if best["native"]:
            r["native"] = round(best["native"][k], 2)
            r["ratio"] = round(best["python"][k] / max(best["native"][k], 1e-9), 2)
        r["count"] = count
        r["load"] = round(os.getloadavg()[0], 2)
        print(json.dumps(r), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=32, help="records per batch (default 32)")
    ap.add_argument("--sizes", default="100,1024", help="body sizes in bytes (default 100,1024)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds, best kept (default 5)")
    ap.add_argument("--reps", type=int, default=300, help="batches per round (default 300)")
    ap.add_argument("--broker", action="store_true", help="broker and client CPU per message, python vs native")
    ap.add_argument("--broker-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=100_000, help="--broker: messages per size (default 100000)")
    args = ap.parse_args()
    if args.broker_child:
        broker_child(args.count)
        return
    if args.broker:
        broker_rounds(args.count, args.rounds)
        return
    impls = {"python": dict(record.PYTHON_FUNCTIONS, decode_batch=message.python_decode_batch)}
    if record.native is not None:
        impls["native"] = dict(record.NATIVE_FUNCTIONS, decode_batch=record.native.decode_batch)
    load = os.getloadavg()[0]
    for size in [int(s) for s in args.sizes.split(",")]:
        template = _batch(args.records, size)
        cases = {name: _cases(impl, template, args.reps) for name, impl in impls.items()}
        best: dict[tuple[str, str], float] = {}
        for _ in range(args.rounds):
            for name, funcs in cases.items():
                for fn_name, run in funcs.items():
                    t0 = time.process_time()
                    run()
                    us = (time.process_time() - t0) * 1e6 / (args.reps * args.records)
                    key = (fn_name, name)
                    best[key] = min(best.get(key, us), us)
        for fn_name in cases["python"]:
            row = {"bench": "record", "function": fn_name, "body": size, "records_per_batch": args.records,
                   "python_us_per_record": round(best[(fn_name, "python")], 3)}
            if "native" in cases:
                row["native_us_per_record"] = round(best[(fn_name, "native")], 3)
                row["speedup"] = round(best[(fn_name, "python")] / max(best[(fn_name, "native")], 1e-9), 1)
            row["crc32c"] = record.native.crc32c_implementation() if record.native else "package"
            row["load"] = round(load, 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
