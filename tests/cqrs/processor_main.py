"""A CommandProcessor process for the crash tests:
`python -m tests.cqrs.processor_main BROKER STORE PATH` runs the test domain until SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
import time

from equeue_cqrs import CommandProcessor, open_event_store

from . import domain


def main() -> None:
    broker, store_name, path = sys.argv[1:4]
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    store = open_event_store(store_name, path, {"sync": "true"})
    # Small batches, so a kill lands between many separate event-store writes.
    processor = CommandProcessor(broker, store, [domain], event_batch=20, pull_batch=16).start()
    print("ready", flush=True)
    deadline = time.monotonic() + 600
    while not stop and time.monotonic() < deadline:
        time.sleep(0.05)
    processor.close()
    store.close()
    print(json.dumps(processor.stats), flush=True)


if __name__ == "__main__":
    main()
