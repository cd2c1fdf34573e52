"""A replica copies its master's log byte for byte and serves the same messages."""

from __future__ import annotations

import os

import pytest

from equeue_core.client.admin import AdminClient
from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.errors import NotMasterError
from tests.conformance.stores.kit import open_store, queue_bytes
from tests.helpers.certs import session_certs
from tests.helpers.waiting import wait_until

from .group import log_text, master, replica, status, wait_caught_up, wait_in_sync

TOPIC = "orders"


def _send(address: str, count: int, batch: int = 1000, start: int = 0) -> None:
    with Producer(address) as p:
        for first in range(start, start + count, batch):
            n = min(batch, start + count - first)
            p.send_batch([Message(TOPIC, f"message {i} ".encode() * (1 + i % 5), tag=f"t{i % 3}",
                                  keys=[f"k{i}"]) for i in range(first, first + n)])


def _same_stores(store: str, a: str, b: str) -> int:
    """Open both data dirs (brokers stopped) and compare every queue's records; returns the count."""
    sa, sb = open_store(store, a), open_store(store, b)
    try:
        assert sa.store.queues() == sb.store.queues()
        total = 0
        for topic, qids in sa.store.queues().items():
            for q in qids:
                assert sa.store.queue_range(topic, q) == sb.store.queue_range(topic, q), (topic, q)
                data = queue_bytes(sa.store, topic, q)
                assert data == queue_bytes(sb.store, topic, q), f"{topic}/{q} differs on the replica"
                total += sa.store.queue_range(topic, q)[1] - sa.store.queue_range(topic, q)[0]
        return total
    finally:
        sa.close()
        sb.close()


def test_100k_messages_reach_the_replica_byte_identical_and_its_queues_serve_them(tmp_path):
    # small chunks, so the copy crosses many chunk rolls
    cfg = tmp_path / "small.toml"
    cfg.write_text("max_frame_size = 2097152\nmax_body_size = 1048576\n"
                   "[store_options.file]\nchunk_size = 2500000\n")
    m = master(tmp_path)
    m.config = str(cfg)
    r = replica(tmp_path, m)
    r.config = str(cfg)
    with m.start(), r.start():
        wait_in_sync(m)
        _send(m.address, 100_000)
        end = wait_caught_up(m, r)
        assert end > 2_500_000 * 3
        # the replica serves pulls of the same records
        with AdminClient(m.address) as am, AdminClient(r.address) as ar:
            for q in range(4):
                got_m = am.read_queue(TOPIC, q, 0, 50)
                got_r = ar.read_queue(TOPIC, q, 0, 50)
                # the same record at the same position (a msg id ends with the position's 16 hex digits)
                assert [(x.msg_id[-16:], x.body, x.queue_offset) for x in got_m] == \
                       [(x.msg_id[-16:], x.body, x.queue_offset) for x in got_r]
            assert am.queue_ranges(TOPIC) == ar.queue_ranges(TOPIC)
    mdir, rdir = os.path.join(m.data_dir, "commitlog"), os.path.join(r.data_dir, "commitlog")
    names = sorted(os.listdir(mdir))
    assert len(names) >= 3 and sorted(os.listdir(rdir)) == names
    for n in names:
        with open(os.path.join(mdir, n), "rb") as a, open(os.path.join(rdir, n), "rb") as b:
            assert a.read() == b.read(), f"chunk {n} differs between master and replica"
    assert _same_stores("file", str(m.data_dir), str(r.data_dir)) == 100_000


@pytest.mark.parametrize("store", ["lmdb", "rocksdb"])
def test_kv_store_replica_serves_the_same_records_at_the_same_positions(tmp_path, store):
    m = master(tmp_path, store=store)
    r = replica(tmp_path, m, store=store)
    with m.start(), r.start():
        wait_in_sync(m)
        _send(m.address, 10_000)
        wait_caught_up(m, r)
    assert _same_stores(store, str(m.data_dir), str(r.data_dir)) == 10_000


def test_a_replica_refuses_sends_naming_its_master_and_catches_up_after_a_restart(tmp_path):
    m = master(tmp_path)
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(r.address) as p, pytest.raises(NotMasterError) as err:
            p.send(Message(TOPIC, b"to a replica"))
        assert err.value.details.get("master") == f"127.0.0.1:{m.port}"
        _send(m.address, 3000)
        wait_caught_up(m, r)
        r.stop()
        _send(m.address, 2000, start=3000)  # while the replica is down
        r.start()
        wait_caught_up(m, r)
        assert status(r)["role"] == "replica"
    assert _same_stores("file", str(m.data_dir), str(r.data_dir)) == 5000


def test_a_replica_far_behind_catches_up_in_fetches_that_fit_the_frame_limit(tmp_path):
    cfg = tmp_path / "small-frames.toml"
    cfg.write_text("max_frame_size = 1048576\nmax_body_size = 524288\n")
    m = master(tmp_path)
    m.config = str(cfg)
    r = replica(tmp_path, m)
    r.config = str(cfg)
    with m.start():
        _send(m.address, 40_000)  # ~5 MB waiting for the replica: one fetch would not fit a frame
        with r.start():
            wait_caught_up(m, r)
    assert _same_stores("file", str(m.data_dir), str(r.data_dir)) == 40_000


@pytest.mark.parametrize("transport", ["tls"])
def test_a_replica_copies_from_a_tls_master_with_its_link_tls_settings(tmp_path, transport):
    # a broker's own outgoing links (registration, replication) use its link_* keys, never a
    # client's EQUEUE_TLS_* variables: the replica verifies the tls:// master with link_tls_ca
    m = master(tmp_path, transport=transport, replication="sync")
    r = replica(tmp_path, m.address, transport=transport,
                env={"EQUEUE_LINK_TLS_CA": str(session_certs().ca)})
    with m.start(), r.start():
        wait_in_sync(m)
        _send(m.address, 2000)
        wait_caught_up(m, r)
        assert status(r)["master_address"].startswith("tls://")
    assert _same_stores("file", str(m.data_dir), str(r.data_dir)) == 2000


def test_an_empty_replica_of_a_master_whose_first_chunks_retention_deleted_is_refused_clearly(tmp_path):
    """Starting it at the retained start would leave its queues without the offsets below: after
    a promotion they would be handed out again. So it is refused, with the way out in the log."""
    small = "max_frame_size = 65000\nmax_body_size = 16384\n[store_options.file]\nchunk_size = 65536\n"
    mcfg, rcfg = tmp_path / "m.toml", tmp_path / "r.toml"
    mcfg.write_text('retention_hours = 0.0002\nretention_policy = "time"\nretention_check_s = 0.3\n' + small)
    rcfg.write_text(small)
    m = master(tmp_path)
    m.config = str(mcfg)
    with m.start():
        _send(m.address, 6000, batch=200)
        chunks = os.path.join(m.data_dir, "commitlog")
        assert wait_until(lambda: min(int(n) for n in os.listdir(chunks)) > 0, 30, 0.2)
        r = replica(tmp_path, m)
        r.config = str(rcfg)
        with r.start():
            assert wait_until(lambda: "seed this replica from a copy" in log_text(r), 30, 0.2), log_text(r)
            assert "below this master's log start" in log_text(m)
            assert status(r)["log_end"] == 0
