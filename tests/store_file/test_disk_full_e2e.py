"""A real full disk under a real broker (sync flush): the broker's data dir is a 4 MiB tmpfs; a
filler file takes the rest of it. While it is full, sends fail with a clear store error; once the
filler is deleted, sends work again without a restart, offsets continue without a gap, and every
acknowledged message is readable. Needs `mount` (the test suite runs as root in its container)."""

from __future__ import annotations

import os

from equeue_core.client import AdminClient, Message, Producer
from equeue_core.errors import EQueueError
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE
from tests.helpers.broker import BrokerProcess
from tests.store_file.full_disk import fill, tiny_tmpfs


def test_sync_sends_work_again_after_disk_space_is_freed_without_a_restart(tmp_path):
    with tiny_tmpfs(tmp_path / "tiny") as mnt:
        broker = None
        try:
            broker = BrokerProcess(mnt, flush="sync").start()  # its log file stays outside, in tmp_path
            with AdminClient(broker.address) as admin:
                admin.create_topic("full", 1)
            acked: list[tuple[int, bytes]] = []
            with Producer(broker.address) as p:
                # 1024 records of 90 bytes: the index file ends exactly on a page (20 B x 1024 = 5
                # pages) and the log in the middle of one, so on the full disk a small record still
                # fits in the log's last page while its index entry needs a new page (the hard case:
                # the log write succeeds, the index write fails)
                for k in range(4):
                    bodies = [b"%010d" % (k * 256 + i) for i in range(256)]
                    r = p.send_batch([Message("full", b) for b in bodies])
                    acked.extend((r[0].queue_offset + i, b) for i, b in enumerate(bodies))
                index = mnt / "index" / "full" / "0" / f"{0:020d}"
                # the log's records end inside a page (the chunk file itself is longer: its length
                # is set ahead of the records, commit_log.py): the last index entry says where
                position, size, _ = INDEX_ENTRY.unpack_from(index.read_bytes(), 1023 * INDEX_ENTRY_SIZE)
                assert index.stat().st_size % 4096 == 0 and (position + size) % 4096 > 0
                filler = mnt / "filler"
                fill(filler)
                errors = []
                for i in range(5):
                    try:
                        body = b"F%09d" % i
                        acked.append((p.send(Message("full", body)).queue_offset, body))
                    except EQueueError as e:
                        errors.append(e)
                assert len(errors) == 5, "a send succeeded on a full disk"
                assert all(e.code == "store" and "space" in str(e).lower() for e in errors), errors
                os.unlink(filler)
                for i in range(20):  # the same broker, no restart
                    body = b"after-%d" % i
                    acked.append((p.send(Message("full", body)).queue_offset, body))
            offsets = [o for o, _ in acked]
            assert offsets == list(range(len(acked))), "offsets must continue without a gap"
            with AdminClient(broker.address) as admin:
                msgs = admin.read_queue("full", 0, 0, len(acked))
            assert [(m.queue_offset, m.body) for m in msgs] == acked
        finally:
            if broker is not None:
                broker.stop()
