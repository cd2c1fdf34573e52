"""Two processes: a reader that sees a verified prefix while a writer appends, and SIGKILL of a
writer in sync-flush mode losing nothing it acknowledged. Every subprocess is bounded in time and
killed/reaped by the test."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from equeue_plugins.store_file.reader import FileStoreReader

from .helpers import open_store, read_all

WRITER = str(Path(__file__).with_name("writer_proc.py"))


def start_writer(data_dir: Path, mode: str, seconds: float, batch: int, pause: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WRITER, str(data_dir), mode, str(seconds), str(batch), str(pause)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def read_line(proc: subprocess.Popen, timeout: float) -> str | None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else None


def test_reader_sees_prefix_while_writing(tmp_path) -> None:
    proc = start_writer(tmp_path, "async", 40.0, 20, 0.002)  # stopped by the test once it has seen enough
    try:
        assert (read_line(proc, 15) or "").startswith("ack"), proc.stderr.read() if proc.poll() else ""
        reader = FileStoreReader(str(tmp_path), {})
        seen_ends = []
        # read until the reader has seen the end move a few times and the writer has rolled a
        # chunk meanwhile (bounded in rounds and time, generous for a loaded machine)
        deadline = time.monotonic() + 30
        rounds = 0
        while time.monotonic() < deadline and rounds < 2000 and (
                len(set(seen_ends)) < 4 or len(os.listdir(tmp_path / "commitlog")) < 2):
            rounds += 1
            lo, hi = reader.queue_range("t", 0)
            offsets: list[int] = []
            body_ok = True
            for batch in reader.export("t", 0, lo, hi, batch_rows=500):
                offsets.extend(batch.column("queue_offset").to_pylist())
                body_ok &= batch.column("body").to_pylist() == [b"m-%d" % o for o in
                                                               batch.column("queue_offset").to_pylist()]
            assert offsets == list(range(lo, hi)), "a reader must get every offset below the safe end"
            assert body_ok
            seen_ends.append(hi)
            time.sleep(0.01)
        reader.close()
        assert seen_ends == sorted(seen_ends) and seen_ends[-1] > seen_ends[0], seen_ends[:5]
        chunks = os.listdir(tmp_path / "commitlog")
        assert len(chunks) >= 2, "the writer should have rolled chunks while being read"
    finally:
        stop(proc)


def test_sigkill_during_sync_appends_keeps_acknowledged(tmp_path) -> None:
    proc = start_writer(tmp_path, "sync", 20.0, 5, 0.0)
    acked: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 15
        while len(acked) < 150 and time.monotonic() < deadline:
            line = read_line(proc, 5)
            if not line:
                break
            if line.startswith("ack"):
                _, first, count = line.split()
                acked.append((int(first), int(count)))
        assert len(acked) >= 20, f"writer too slow or failed: {proc.stderr.read() if proc.poll() else acked}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        stop(proc)
    assert [f for f, _ in acked] == [i * 5 for i in range(len(acked))]
    store, report = open_store(tmp_path)
    assert not report.clean
    # a killed process loses no byte it wrote (the page cache keeps them): anything reported cut
    # would be the zero tail ahead of the records (commit_log.py) taken for torn data
    assert report.truncated_bytes == 0, report.notes
    last = acked[-1][0] + acked[-1][1]
    lo, hi = store.queue_range("t", 0)
    assert lo == 0 and hi >= last
    msgs = read_all(store)
    assert [m.queue_offset for m in msgs] == list(range(hi))
    assert [m.body for m in msgs[:last]] == [b"m-%d" % i for i in range(last)]
    store.close()
