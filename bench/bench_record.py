"""Per-record CPU cost of the record hot path, Python against native in the same run (not a test):

    .venv/bin/python -m bench.bench_record [--records 32] [--sizes 100,1024] [--rounds 5]

For each body size, a batch of --records records goes through what the broker does per producer
batch (scan with the topic and body checks, stamp_batch with its crc, index_entries), what a
verified read does (damage per record; crc_spans for the whole batch) and what the consumer does
(client decode_batch). Both implementations alternate round by round; the best round's CPU time
(time.process_time) per record is printed as one JSON line per function and size, with the ratio.
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

    return {"scan": run_scan, "stamp_batch": run_stamp, "index_entries": run_entries, "damage": run_damage,
            "crc_spans": run_spans, "decode_batch": run_decode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=32, help="records per batch (default 32)")
    ap.add_argument("--sizes", default="100,1024", help="body sizes in bytes (default 100,1024)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds, best kept (default 5)")
    ap.add_argument("--reps", type=int, default=300, help="batches per round (default 300)")
    args = ap.parse_args()
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
