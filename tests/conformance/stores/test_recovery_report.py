"""The recovery report, on every store: `RecoveryReport.rebuilt` and `.lost` say exactly which
index ranges recovery rebuilt from the log or could not find, as IndexRange(topic, queue_id,
first_offset, last_offset). After a clean stop with intact files both are empty; after a SIGKILL
every rebuilt offset is readable and in range, and nothing acknowledged (sync flush) is lost."""

from __future__ import annotations

import pytest

from equeue_core.contracts import IndexRange, RecoveryReport

from .kit import append, check_message, read_all
from .test_processes import T, _kill_writer_mid_appends


def test_clean_reopen_reports_nothing_rebuilt_or_lost(harness):
    h = harness.open()
    append(h, "t", 0, 40)
    append(h, "t", 3, 7)
    h.close()
    h = harness.open()
    report = h.report
    assert isinstance(report, RecoveryReport)
    assert report.clean and report.rebuilt == [] and report.lost == []
    assert report.rebuilt_entries == 0
    h.close()


@pytest.mark.failure
def test_report_after_sigkill_lists_only_readable_rebuilt_ranges_and_loses_nothing_acknowledged(harness):
    acked_end = _kill_writer_mid_appends(harness)
    h = harness.open()
    report = h.report
    assert not report.clean
    lo, hi = h.store.queue_range(T, 0)
    assert hi >= acked_end
    for r in report.rebuilt:
        assert isinstance(r, IndexRange) and r.first_offset <= r.last_offset
        assert lo <= r.first_offset and r.last_offset < hi, f"{r} is outside [{lo}, {hi})"
        for i, m in enumerate(read_all(h.store, r.topic, r.queue_id, r.first_offset, r.last_offset + 1)):
            check_message(m, r.topic, r.queue_id, r.first_offset + i)
    assert report.rebuilt_entries == sum(r.last_offset - r.first_offset + 1 for r in report.rebuilt)
    for r in report.lost:
        assert r.first_offset >= acked_end, f"{r}: an acknowledged record was lost"
    h.close()
