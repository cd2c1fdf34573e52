"""A writer process for the cross-process tests: `python writer_proc.py DIR MODE SECONDS BATCH PAUSE`.

Opens a file store in DIR with 64 KiB chunks and flush MODE ("sync"/"async"), appends batches of
BATCH records to queue 0 of topic "t" (record n's body is b"m-<n>"), and after each batch prints
"ack <first offset> <count>" once it is durable (sync mode: wait_flushed resolved) or written
(async mode). Runs at most SECONDS, then closes cleanly and prints "done".
"""

from __future__ import annotations

import sys
import time

from equeue_plugins.store_file.queue_index import FileQueueIndex
from equeue_plugins.store_file.store import FileMessageStore

from equeue_core import record
from equeue_core.contracts import StoreSettings


def main() -> None:
    data_dir, mode, seconds, batch, pause = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    s = StoreSettings(data_dir, flush=mode, flush_interval_ms=20,
                      options={"chunk_size": 64 * 1024, "index_file_entries": 256})
    store = FileMessageStore(s, FileQueueIndex(s))
    store.open()
    nxt = store.queue_range("t", 0)[1]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        buf = bytearray(b"".join(record.encode_record("t", b"m-%d" % (nxt + i)) for i in range(batch)))
        r = store.append("t", 0, buf, record.scan(buf))
        if mode == "sync":
            store.wait_flushed(r.end_position).result(timeout=10)
        print(f"ack {r.first_queue_offset} {batch}", flush=True)
        nxt = r.first_queue_offset + batch
        if pause:
            time.sleep(pause)
    store.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
