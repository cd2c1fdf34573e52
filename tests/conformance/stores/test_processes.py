"""Other processes: a reader following a live writer, and a writer killed with SIGKILL."""

from __future__ import annotations

import json
import os
import time

from equeue_core import record

from .kit import Child, append, check_message, read_all

T = "live"


def test_reader_in_another_process_sees_an_intact_growing_prefix(harness):
    h = harness.open()
    append(h, T, 0, 100)
    h.store.flush()
    stop_file = os.path.join(harness.data_dir, "..", "stop-reader")
    child = Child.start("_live_reader.py", harness.name, harness.data_dir, T, "0", stop_file, "60")
    try:
        assert child.read_until(lambda lines: "ready" in lines, timeout=30), child.drain(5)
        for _ in range(40):
            append(h, T, 0, 100)
            time.sleep(0.02)
        h.store.flush()
        open(stop_file, "w").close()
        err = child.drain(timeout=60)
    finally:
        child.stop()
    assert child.proc.returncode == 0, err
    summary = json.loads(child.lines[-1])
    assert summary["errors"] == []
    assert summary["seen"] == 4100, "the reader must reach the final max offset once the writer flushed"
    assert len(summary["observed"]) >= 2 and summary["observed"][0] < 4100, \
        "the reader never saw the queue grow while the writer appended"


def _kill_writer_mid_appends(harness) -> int:
    """Run the sync-mode writer until it has acknowledged a few dozen batches, SIGKILL it, and
    return the queue offset its acknowledgements reached."""
    child = Child.start("_crash_writer.py", harness.name, harness.data_dir, T)
    try:
        assert child.read_until(lambda lines: "ready" in lines, timeout=30), child.drain(5)
        started = time.monotonic()
        child.read_until(lambda lines: len(lines) > 60 or time.monotonic() - started > 3, timeout=30)
        child.stop()  # SIGKILL, mid-append as likely as not
        err = child.drain(timeout=10)
    finally:
        child.stop()
    acks = [tuple(map(int, line.split()[1:])) for line in child.lines if line.startswith("ack ")]
    assert len(acks) >= 5, f"the writer acknowledged too little before the kill: {err}"
    acked_end = acks[0][0]
    for first, n in acks:
        assert first == acked_end, "acknowledgements out of order"
        acked_end = first + n
    return acked_end


def test_sigkill_during_sync_appends_loses_no_acknowledged_record(harness):
    for _round in range(2):  # the second writer continues the store the first one left behind
        acked_end = _kill_writer_mid_appends(harness)
        h = harness.open()
        assert not h.report.clean, "a SIGKILL must not be reported as a clean stop"
        lo, hi = h.store.queue_range(T, 0)
        assert lo == 0 and hi >= acked_end, f"acknowledged up to {acked_end}, store has [{lo}, {hi})"
        msgs = read_all(h.store, T, 0, 0, hi, max_count=500)  # verifies every crc on the way
        for i, msg in enumerate(msgs):
            check_message(msg, T, 0, i)
        positions = [m.position for m in msgs]
        assert positions == sorted(set(positions))
        assert record.verify(h.store.read_position(positions[-1])) > 0
        h.close()
    # the recovered store keeps what was saved before the appends, and takes new appends right
    # after what survived
    h = harness.open()
    assert h.engine.topics.load() == {T: 1}
    assert h.engine.offsets.get("g", T, 0) == 5
    assert append(h, T, 0, 2).first_queue_offset == hi
