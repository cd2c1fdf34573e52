"""Store time never goes backwards within a data directory: not between batches appended faster
than the clock ticks, and not across a restart whose clock is behind the last writer's (a clock
set back, or another machine's). offset_for_timestamp binary-searches on it."""

from __future__ import annotations

import shutil

import pytest

from .kit import Child, append, read_all

T = "clock"
WEEK_MS = 7 * 86_400_000


def _store_times(h, end: int) -> list[int]:
    return [m.store_ts for m in read_all(h.store, T, 0, 0, end)]


def test_store_times_of_batches_faster_than_the_clock_never_decrease(harness):
    h = harness.open()
    for _ in range(300):  # most land in the same millisecond as the one before
        append(h, T, 0, 2)
    times = _store_times(h, 600)
    assert times == sorted(times)
    for offset in (0, 123, 599):
        first = h.store.offset_for_timestamp(T, 0, times[offset])
        assert times[first] == times[offset] and (first == 0 or times[first - 1] < times[offset])


def test_store_time_never_goes_back_across_a_restart_with_the_clock_a_week_behind(harness):
    if shutil.which("faketime") is None:
        pytest.fail("the faketime command is missing: `make system-deps` installs it")
    h = harness.open()
    append(h, T, 0, 40)
    newest_before = _store_times(h, 40)[-1]
    h.close()
    child = Child.start("_writer.py", harness.name, harness.data_dir, T, "40", prefix=("faketime", "-f", "-7d"))
    try:
        assert child.read_until(lambda lines: any(x.startswith(("writing", "refused")) for x in lines), timeout=60), \
            child.drain(5)
        assert child.lines[-1].startswith("writing"), child.lines
        child_clock = int(child.lines[-1].split()[2])
        assert child_clock < newest_before - WEEK_MS + 3_600_000, "the writer's clock was not set back"
        child.drain(timeout=60)  # closes its stdin: it closes the store
    finally:
        child.stop()
    assert child.lines[-1] == "closed", child.lines
    h = harness.open()
    times = _store_times(h, 80)
    assert times == sorted(times), "store time went backwards after the restart"
    assert min(times[40:]) >= newest_before
    assert h.store.offset_for_timestamp(T, 0, newest_before + 1) >= 40
