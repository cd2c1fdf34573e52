"""The broker process's startup heap, kept out of the cyclic GC's full collections.

Why. A full collection (generation 2) walks every object the GC tracks, and it holds the GIL, so
the broker's event loop stops for it: no send is acknowledged and no pull answered meanwhile. After
start-up a broker process tracks ~28k objects (its modules, classes, functions, plugins, config),
nearly all of them alive until the process ends, and a full collection of them took 10-16 ms on
the project's 2-core VM. The broker's requests leave no reference cycles (docs/benchmarks.md,
"The broker's cyclic garbage"), so at a steady rate it runs no collection at all; but a burst of
objects that outlive the young generations (a consumer taking 1000 queues parks 1000 held pulls)
ends in one: every drain of 300k messages from 1000 queues had one full collection of 11-16 ms.
With the startup heap frozen (`gc.freeze()`), a full collection walks only what was made since:
0.1-1.0 ms after the same drain (docs/benchmarks.md, "The broker's startup heap out of the GC").

What is guaranteed, and what it costs:
- Only the broker command's own process does this (equeue_core/cli/main.py, after the broker has
  started and before it says it listens), never `Broker` itself: a program or test that runs a
  Broker in its own process keeps its GC as it was.
- Objects made after the freeze are collected as before: connections, held pulls, topics created
  later.
- A frozen object is still freed by reference counting when its last reference goes. What a
  frozen object can no longer be is collected as part of a reference cycle: garbage cycles among
  the objects alive at start-up stay in memory. That is bounded by the startup heap, which never
  grows (a collection at that moment found ~40 unreachable objects, and took 10-20 ms of the
  start, so none is run).
- BROKER_STATS reports the count as `gc_frozen_objects` (0 where nothing was frozen).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Move every object this process tracks now into the GC's permanent generation (see the
    module docstring); returns how many objects are frozen."""
    gc.freeze()
    return gc.get_freeze_count()
