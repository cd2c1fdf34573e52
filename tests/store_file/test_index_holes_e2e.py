"""Index holes through a real broker: an index file lost or truncated while the broker was down
(after a clean stop, and after kill -9) is rebuilt from the log at start; every message is visible
at its original offset, new sends continue after the max offset, and the broker prints and reports
the rebuilt range."""

from __future__ import annotations

import os
import threading

import pytest

from equeue_core.client import AdminClient, Message, Producer
from tests.helpers.broker import BrokerProcess

N = 300


def _start_lines(broker: BrokerProcess, count: int, timeout: float = 30.0) -> list[str]:
    """The first `count` lines the broker printed after "listening on" (read on a helper thread,
    so a missing line fails the test instead of hanging it)."""
    lines: list[str] = []

    def read() -> None:
        for _ in range(count):
            line = broker.proc.stdout.readline()
            if not line:
                return
            lines.append(line.decode().rstrip("\n"))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    return list(lines)


def _damage(data_dir, how: str) -> None:
    path = os.path.join(data_dir, "index", "holes", "0", f"{0:020d}")
    if how == "delete":
        os.unlink(path)
    else:
        os.truncate(path, 20 * 100)  # offsets 100.. gone from the index


@pytest.mark.parametrize("how", ["delete", "truncate"])
@pytest.mark.parametrize("stop", ["clean", pytest.param("kill", marks=pytest.mark.failure)])
def test_lost_index_file_is_rebuilt_at_broker_start_without_reusing_offsets(tmp_path, stop, how):
    broker = BrokerProcess(tmp_path / "data", flush="sync").start()
    try:
        with AdminClient(broker.address) as admin:
            admin.create_topic("holes", 1)
        with Producer(broker.address) as p:
            p.send_batch([Message("holes", f"body-{i}".encode()) for i in range(N)])
        broker.stop() if stop == "clean" else broker.kill()
        _damage(broker.data_dir, how)
        broker.start()
        with AdminClient(broker.address) as admin:
            rec = admin.broker_info()["recovery"]
        # after a kill, if the last checkpoint is older than the sends, the tail scan continues a
        # truncated index where it ends (100) instead of rebuilding the queue: the report says
        # which of the two happened, exactly
        first = rec["rebuilt"][0][2] if (stop, how) == ("kill", "truncate") else 0
        assert first in (0, 100)
        assert rec["rebuilt"] == [["holes", 0, first, N - 1]] and rec["lost"] == []
        lines = _start_lines(broker, 4)  # data dir, plugins, recovery, the one range
        assert lines[-1] == f"  rebuilt   index of holes/0 offsets {first}..{N - 1} from the log", lines
        with AdminClient(broker.address) as admin:
            assert admin.queue_ranges("holes") == [[0, N]]
            msgs = admin.read_queue("holes", 0, 0, N)
        assert [(m.queue_offset, m.body) for m in msgs] == [(i, f"body-{i}".encode()) for i in range(N)]
        with Producer(broker.address) as p:
            r = p.send(Message("holes", b"after"))
        assert r.queue_offset == N, "a queue offset was handed out twice"
    finally:
        broker.stop()
