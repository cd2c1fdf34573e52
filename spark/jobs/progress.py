"""Progress of the pipeline jobs (queues done, rows, rows/s) through the CLI's ProgressReport.

A rich bar on a terminal; not on a terminal, a plain line every few seconds (and at the end when
asked for with progress=True). Enabled when asked, or with progress=None as ProgressReport decides.
"""

from __future__ import annotations

import time
from typing import TextIO

from equeue_core.cli.progress import ProgressReport


class Progress:
    """Counts queues exported (the bar) and rows written (with their rate)."""

    def __init__(self, total: int, label: str, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.report = ProgressReport(max(0, total), label, unit="queues", enabled=enabled, stream=stream)
        self.rows = 0
        self._start = time.monotonic()

    @property
    def done(self) -> int:
        return self.report.done

    def advance(self, rows: int = 0, done: int = 1) -> None:
        self.rows += rows
        elapsed = time.monotonic() - self._start
        rate = f"{self.rows / elapsed:,.0f} rows/s" if elapsed > 0 else ""
        self.report.update(self.report.done + done, extra=f"{self.rows:,} rows  {rate}")

    def draw(self, force: bool = False) -> None:
        self.report.update(self.report.done, extra=self.report.extra)

    def finish(self) -> None:
        self.report.finish()
