"""Subprocess for test_crash: appends in sync flush mode and prints "ack <first> <count>" only
after wait_flushed resolved, until it is killed (or a bounded number of records is written)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kit import append, open_store  # noqa: E402

SIZES = (1, 7, 64, 3, 250, 19)
MAX_RECORDS = 2_000_000


def main(name: str, data_dir: str, topic: str) -> None:
    h = open_store(name, data_dir, flush="sync")
    h.engine.topics.save({topic: 1})
    h.engine.offsets.commit("g", topic, 0, 5)
    h.engine.offsets.persist()
    print("ready", flush=True)
    written = 0
    i = 0
    while written < MAX_RECORDS:
        n = SIZES[i % len(SIZES)]
        i += 1
        res = append(h, topic, 0, n)
        h.store.wait_flushed(res.end_position).result(timeout=60)
        print(f"ack {res.first_queue_offset} {n}", flush=True)
        written += n


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
