"""equeue_core.flush.Flusher: a failed flush is not permanent. The fsync that fails is a real one:
os.fsync on a descriptor the kernel refuses to sync (a pipe: EINVAL), swapped for a real file's
descriptor when "space is freed"."""

from __future__ import annotations

import os

import pytest

from equeue_core.errors import StoreError
from equeue_core.flush import Flusher


class SyncTarget:
    """A flush function over a real descriptor: fsync it, report the position written so far."""

    def __init__(self, path) -> None:
        self.file_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.pipe_r, self.pipe_w = os.pipe()
        self.fd = self.file_fd
        self.written = 0
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        end = self.written
        os.fsync(self.fd)
        return end

    def close(self) -> None:
        for fd in (self.file_fd, self.pipe_r, self.pipe_w):
            os.close(fd)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sync_waits_work_again_after_a_failed_fsync_without_a_restart(tmp_path, mode) -> None:
    target = SyncTarget(tmp_path / "data")
    flusher = Flusher(target, mode, interval_ms=20)
    flusher.start(0)
    try:
        target.written = 10
        flusher.written(10)
        flusher.wait(10).result(timeout=10)

        target.fd = target.pipe_r  # the disk fails
        target.written = 20
        flusher.written(20)
        for _ in range(3):  # every wait while it fails gets the error, promptly, never a hang
            with pytest.raises(StoreError, match="flush to disk failed"):
                flusher.wait(20).result(timeout=10)
        assert flusher.flushed == 10
        assert flusher.failures >= 3 if mode == "sync" else flusher.failures >= 1

        target.fd = target.file_fd  # space freed
        target.written = 30
        flusher.written(30)
        flusher.wait(30).result(timeout=10)
        assert flusher.flushed == 30 and flusher.last_error is None
    finally:
        flusher.stop()
        target.close()
