"""The file store's atomic small-file writes: the kernel's equeue_core.atomic_file (shared with
the replication epoch file)."""

from __future__ import annotations

from equeue_core.atomic_file import fsync_dir, write_atomic

__all__ = ["fsync_dir", "write_atomic"]
