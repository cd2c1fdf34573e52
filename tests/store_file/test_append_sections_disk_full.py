"""A SEND_MULTI's sections on a real full disk (a 4 MiB tmpfs, filled): the file store writes
every section's records with one write(2), then indexes them one by one. When a section's index
write fails, that section and the later ones must leave both the log and the index, and the
sections before it stay stored: what the broker answered as stored is what a reader and the next
open find, and appends go on without a gap once there is space again. Needs `mount` (the test
suite runs as root in its container)."""

from __future__ import annotations

import os

from equeue_core.store_sections import append_sections
from tests.conformance.stores.kit import append, check_message, make_batch, open_store, read_all
from tests.store_file.full_disk import fill, tiny_tmpfs

PAGE = 4096


def _section(opened, topic: str, queue_id: int, first: int):
    buf, starts = make_batch(topic, queue_id, first, 1)
    return (topic, queue_id, buf, starts)


def test_a_failed_index_write_takes_its_section_and_the_later_ones_back(tmp_path):
    with tiny_tmpfs(tmp_path / "tiny") as mnt:
        opened = None
        try:
            opened = open_store("file", str(mnt))
            # queue c: one entry, its index page has room; queue b: 1024 entries of 20 B, its index
            # ends exactly on a page, so its next entry needs a page the full disk will not have
            append(opened, "c", 0, 1)
            for _ in range(4):
                append(opened, "b", 0, 256)
            index_b = mnt / "index" / "b" / "0" / f"{0:020d}"
            assert index_b.stat().st_size == 1024 * 20 and index_b.stat().st_size % PAGE == 0
            # the log's end must leave room in its page for three small records (~200 B): pad with
            # records of queue p until it does (bounded: a record is well under a page)
            for _ in range(64):
                end = append(opened, "p", 0, 1).end_position
                if PAGE - end % PAGE >= 600:
                    break
            else:
                raise AssertionError("the log never left room in its last page")
            opened.store.wait_flushed(end).result(timeout=10)
            fill(mnt / "filler")
            sections = [_section(opened, "c", 0, 1), _section(opened, "b", 0, 1024), _section(opened, "c", 0, 2)]
            stored, failed = append_sections(opened.store, sections)
            kept_end = stored[0].end_position
            assert len(stored) == 1 and stored[0].first_queue_offset == 1, stored
            assert failed is not None and failed.code == "store" and "space" in str(failed).lower(), failed
            assert opened.store.queue_range("c", 0) == (0, 2)
            assert opened.store.queue_range("b", 0) == (0, 1024)
            os.unlink(mnt / "filler")
            # space again: the same store goes on where the stored sections left it, without a gap
            stored, failed = append_sections(opened.store, [_section(opened, "b", 0, 1024), _section(opened, "c", 0, 2)])
            assert failed is None and [r.first_queue_offset for r in stored] == [1024, 2]
            # the log goes on right after the last section stored: the others' records were cut off
            assert stored[0].positions[0] == kept_end
            opened.store.wait_flushed(stored[-1].end_position).result(timeout=10)
            for reopen in (False, True):
                if reopen:
                    opened.close()
                    opened = open_store("file", str(mnt))
                    assert opened.report.truncated_bytes == 0  # the log ends where the last section did
                for topic, end in (("c", 3), ("b", 1025)):
                    assert opened.store.queue_range(topic, 0) == (0, end)
                    for offset, msg in enumerate(read_all(opened.store, topic, 0, 0, end)):
                        check_message(msg, topic, 0, offset)
        finally:
            if opened is not None:
                opened.close()
