"""The broker process's C allocator: frame-sized buffers a request frees are kept for the next one.

Why. glibc's malloc gives a block above its mmap threshold (128 KiB at first, raised as such
blocks are freed) pages of its own, and hands the free top of its heap back to the kernel once it
passes the trim threshold (128 KiB at first, then twice the mmap threshold). A broker frees its large buffers as soon as
a request is done: a SEND or SEND_MULTI frame's body, and the commit-log write that joins a
SEND_MULTI's sections, each up to a producer's 512 KiB batch. Whether the next frame's buffers
found those pages again or fresh ones depended on the heap's history, and every first touch of a
fresh page is a page fault (~2.5 µs on the project's 2-core VM). 300k messages of 1 KiB over 100
topics cost a broker process 130k page faults; its CPU a message was 2.57 µs, 1.73 of them in
the kernel, and the produce ran at 284k msg/s. With the thresholds fixed: 1.1k faults, 1.79 µs
(0.73 in the kernel), 343k msg/s (docs/benchmarks.md, "Page faults on every large frame").

What. `keep_freed_memory()` fixes both thresholds (mallopt): blocks up to MMAP_THRESHOLD come
from the heap, and the heap keeps up to TRIM_THRESHOLD of free memory at its top instead of
returning it. Fixing them also stops glibc's own adjustment of them.

What is guaranteed, and what it costs:
- Only the broker command's own process does this (equeue_core/cli/main.py, before the broker is
  made), never `Broker` itself: a program that runs a Broker keeps its allocator as it was.
- Only where the C library is glibc; elsewhere nothing changes. Where MALLOC_MMAP_THRESHOLD_ or
  MALLOC_TRIM_THRESHOLD_ is set in the environment, glibc has read it and the broker leaves both
  thresholds to it.
- The process may hold up to TRIM_THRESHOLD of freed memory that it would have returned before.
  Blocks above MMAP_THRESHOLD (a frame near max_frame_size) still get pages of their own and go
  back to the kernel when freed.
- BROKER_STATS reports the thresholds set as `malloc` (nil where nothing was set).
"""

from __future__ import annotations

import os

MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 32 * 1024 * 1024
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_set: dict[str, int] | None = None


def keep_freed_memory() -> dict[str, int] | None:
    """Set both thresholds in this process (see the module docstring). Returns what was set (a
    threshold glibc refused is left out), or None where nothing was: not glibc, or the
    environment already chose."""
    global _set
    if _set is not None:
        return _set
    if not is_glibc() or any(name in os.environ for name in ENVIRONMENT):
        return None
    import ctypes  # here: BROKER_STATS reads malloc_settings() in every broker, this only the command

    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    wanted = {"mmap_threshold": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
              "trim_threshold": (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)}
    _set = {name: value for name, (param, value) in wanted.items() if mallopt(param, value) == 1} or None
    return _set


def malloc_settings() -> dict[str, int] | None:
    """What `keep_freed_memory()` set in this process, or None."""
    return _set


def is_glibc() -> bool:
    """Whether this process's C library is glibc (the thresholds are glibc's)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):
        return False
