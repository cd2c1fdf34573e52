"""Crash recovery through the whole broker (file store): a corrupt tail is cut, the rest survives."""

from __future__ import annotations

import os

from equeue_core import msgid
from equeue_core.client import AdminClient, Message, Producer


def _chunk_holding(data_dir, position: int) -> tuple[str, int]:
    log_dir = os.path.join(data_dir, "commitlog")
    starts = sorted(int(n) for n in os.listdir(log_dir) if n.isdigit())
    start = max(s for s in starts if s <= position)
    return os.path.join(log_dir, f"{start:020d}"), start


def test_corrupt_tail_record_is_truncated_and_everything_before_it_kept(file_broker):
    with Producer(file_broker.address) as p:
        results = [p.send(Message("recover", f"body-{i}".encode()), routing_key="one-queue") for i in range(100)]
    q = results[0].queue_id
    file_broker.kill()  # a crash: no clean-shutdown checkpoint, so the tail is verified on start
    _h, _p, position = msgid.decode(results[-1].msg_id)
    path, start = _chunk_holding(file_broker.data_dir, position)
    with open(path, "r+b") as f:
        f.seek(position - start + 80)  # inside the record, past the header
        b = f.read(1)
        f.seek(position - start + 80)
        f.write(bytes([b[0] ^ 0xFF]))
    file_broker.start()
    with AdminClient(file_broker.address) as admin:
        info = admin.broker_info()
        assert info["recovery"]["clean"] is False
        assert info["recovery"]["truncated_bytes"] > 0
        lo, hi = admin.queue_ranges("recover")[q]
        assert (lo, hi) == (0, 99)
        msgs = admin.read_queue("recover", q, 0, 99)
    assert [m.body for m in msgs] == [f"body-{i}".encode() for i in range(99)]
    with Producer(file_broker.address) as p:  # the log goes on where the good data ended
        r = p.send(Message("recover", b"after"), routing_key="one-queue")
    assert r.queue_offset == 99
