"""A replica killed between sealing its chunk (copying its master's roll) and writing the first
record of the next chunk: it reopens with its end at the next chunk's start, reads nothing between
the seal and that end, and the copy continues from there to the master's exact log.

The conformance kit's kill -9 copier hits this point only when the kill lands inside that window;
here it is made on purpose (seal, then crash)."""

from __future__ import annotations

from equeue_plugins.store_file.replica_log import FileReplicaLog

from .helpers import SMALL_CHUNK, append, crash, open_store, read_all


def _copy_all(src: FileReplicaLog, dst: FileReplicaLog) -> None:
    end = dst.end_position()
    for _ in range(10_000):
        data = src.read_log(end, 4000)
        if not data:
            return
        end = dst.append_log(end, data)
    raise AssertionError("copy did not finish")


def test_replica_killed_after_its_roll_reopens_at_the_next_chunk_and_copies_on(tmp_path) -> None:
    master, _ = open_store(tmp_path / "m")
    for i in range(40):
        append(master, 30, queue_id=i % 2, body=b"x" * 40)
    assert master.log.published_end > 2 * SMALL_CHUNK
    src = FileReplicaLog(master)
    replica, _ = open_store(tmp_path / "r")
    dst = FileReplicaLog(replica)
    # copy the first chunk's records only: the next read answers from the second chunk's start
    end = 0
    for _ in range(1000):
        data = src.read_log(end, 4000)
        if int.from_bytes(data[12:20], "little") == SMALL_CHUNK:
            break
        end = dst.append_log(end, data)
    sealed_at = end
    assert 0 < sealed_at < SMALL_CHUNK
    replica.log.seal_chunk()  # what append_log does first for the roll ...
    crash(replica)            # ... and the process dies before the record lands

    replica, report = open_store(tmp_path / "r")
    dst = FileReplicaLog(replica)
    try:
        assert not report.clean
        assert dst.end_position() == SMALL_CHUNK
        assert dst.read_log(sealed_at, 4000) == b""  # the marker, then nothing: no record is missing
        _copy_all(src, dst)
        assert dst.end_position() == src.end_position()
        for q in (0, 1):
            assert replica.queue_range("t", q) == master.queue_range("t", q)
            assert [m.body for m in read_all(replica, queue_id=q)] == [m.body for m in read_all(master, queue_id=q)]
    finally:
        replica.close()
        master.close()
