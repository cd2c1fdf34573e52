"""A one-line progress bar on stderr for the pipeline jobs (queues done / rows)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Redraws one line (carriage return) at most every 0.1 s; silent when disabled.

    Enabled when asked (progress=True) or, with progress=None, when stderr is a terminal.
    """

    def __init__(self, total: int, label: str, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = max(0, total)
        self.label = label
        self.done = 0
        self.rows = 0
        self._last = 0.0
        self._start = time.monotonic()

    def advance(self, rows: int = 0, done: int = 1) -> None:
        self.done += done
        self.rows += rows
        self.draw(force=self.done >= self.total)

    def draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        filled = width if self.total == 0 else int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        elapsed = now - self._start
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} queues  "
                          f"{self.rows:,} rows  {elapsed:.1f}s")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
