"""Subprocess for test_single_writer: opens the store engine on a data dir as a broker would.

On success it appends `count` records to queue 0 of topic `topic`, flushes, prints "writing
<pid> <its clock in ms>" and holds the engine until stdin closes (then closes it cleanly and prints "closed").
If the engine cannot be opened it prints "refused <ErrorClass> <message>" and exits with 3.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kit import append, open_store  # noqa: E402

from equeue_core.errors import EQueueError  # noqa: E402


def main(name: str, data_dir: str, topic: str, count: int) -> int:
    try:
        h = open_store(name, data_dir)
    except EQueueError as e:
        print(f"refused {type(e).__name__} {e}", flush=True)
        return 3
    append(h, topic, 0, count)
    h.store.flush()
    print(f"writing {os.getpid()} {time.time_ns() // 1_000_000}", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    h.close()
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
