"""Subprocess for test_live_reader: follows a queue through the store reader while another
process appends, checking every exported row. Prints "ready", then one JSON summary line."""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyarrow  # noqa: E402,F401  (imported before "ready" so the first export is not slow)
from kit import body_for  # noqa: E402

from equeue_core.plugins import get_plugin_manager  # noqa: E402


def main(name: str, data_dir: str, topic: str, queue_id: int, stop_file: str, limit_s: float) -> None:
    reader = get_plugin_manager().store_reader(name)(data_dir, {})
    print("ready", flush=True)
    seen = 0
    observed: list[int] = []
    errors: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and len(errors) < 5:
        stop = os.path.exists(stop_file)
        lo, hi = reader.queue_range(topic, queue_id)
        if hi < seen:
            errors.append(f"max offset went back from {seen} to {hi}")
        elif hi > seen:
            observed.append(hi)
            for batch in reader.export(topic, queue_id, seen, hi, batch_rows=1000):
                for off, body in zip(batch.column("queue_offset").to_pylist(), batch.column("body").to_pylist(),
                                     strict=True):
                    if off != seen:
                        errors.append(f"expected offset {seen}, got {off}")
                    elif body != body_for(topic, queue_id, off):
                        errors.append(f"body of offset {off} differs")
                    seen = off + 1
        if stop:
            break
        time.sleep(0.005)
    reader.close()
    print(json.dumps({"seen": seen, "observed": observed, "errors": errors}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], float(sys.argv[6]))
