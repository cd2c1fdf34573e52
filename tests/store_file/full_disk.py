"""A real disk that fills up, for the disk-full tests: a 4 MiB tmpfs mounted for the test (the
suite runs as root in its container, as CI does), and a filler file that takes whatever is left.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def tiny_tmpfs(mnt: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `mnt` (made here) for the block, unmounted after (lazily: a
    process the test failed to stop must not keep it mounted)."""
    assert os.geteuid() == 0, "this test mounts a tmpfs: run the suite as root (as CI does)"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True,
                   capture_output=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def fill(path: Path) -> None:
    """Write `path` until its file system is full (ENOSPC), to the last 4 KiB page."""
    block = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        for _ in range(4096):  # bounded: 256 MiB is far more than the filesystem holds
            try:
                f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        else:
            raise AssertionError("the filesystem never filled up")
    for _ in range(64):  # the last partial block may have fit: top it off byte-wise
        try:
            with open(path, "ab", buffering=0) as f:
                f.write(b"\0" * 4096)
        except OSError:
            break
