"""One bank command processor process: `python -m examples.bank.processor BROKER STORE PATH`.
Runs until SIGTERM (then drains, commits its offsets and prints its stats as JSON)."""

from __future__ import annotations

import json
import signal
import sys
import time

from equeue_cqrs import CommandProcessor, open_event_store

from . import domain

GROUP = "bank-processor"


def main() -> None:
    broker, store_name, path = sys.argv[1:4]
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    store = open_event_store(store_name, path)
    processor = CommandProcessor(broker, store, [domain], group=GROUP, commands_topic="bank-commands",
                                 events_topic="bank-events").start()
    print("ready", flush=True)
    while not stop:
        time.sleep(0.05)
    processor.close()
    store.close()
    print(json.dumps(processor.stats), flush=True)


if __name__ == "__main__":
    main()
