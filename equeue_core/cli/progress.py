"""Progress of a long command run (produce, consume, spark export) on stderr, with its rate.

On a terminal: a rich progress bar (count, rate, elapsed, time left) redrawn in place. Not on a
terminal (a pipe, a CI log): a plain line every few seconds, so a short run prints nothing and a
long one leaves a readable trail instead of carriage-return noise. `enabled=False` silences it;
`enabled=True` also prints a last plain line at the end when not on a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

PLAIN_EVERY_S = 5.0


def _rate(done: float, seconds: float) -> str:
    return f"{done / seconds:,.0f}/s" if seconds > 0 else "-"


class ProgressReport:
    """update(done) with an absolute count; finish() once. `total` None: no bar, count and rate."""

    def __init__(self, total: int | None, label: str, unit: str = "msgs", enabled: bool | None = None,
                 stream: TextIO | None = None, plain_every_s: float = PLAIN_EVERY_S) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.label = label
        self.unit = unit
        self.forced = enabled is True
        self.enabled = enabled is not False
        self.terminal = self.enabled and self.stream.isatty()
        self.plain_every_s = plain_every_s
        self.done = 0
        self.extra = ""
        self._start = time.monotonic()
        self._last_plain = self._start
        self._bar: Any = None
        if self.terminal:
            self._start_bar()

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns: list[Any] = [TextColumn("[bold]{task.description}")]
        if self.total is not None:
            columns += [BarColumn(), MofNCompleteColumn(), TextColumn(self.unit), TaskProgressColumn()]
        else:
            columns += [TextColumn("{task.completed:,.0f}"), TextColumn(self.unit)]
        columns += [TextColumn("[cyan]{task.fields[rate]}"),
                    TextColumn("{task.fields[extra]}"), TimeElapsedColumn()]
        if self.total is not None:
            columns.append(TimeRemainingColumn())
        self._bar = Progress(*columns, console=Console(file=self.stream), refresh_per_second=5)
        self._task = self._bar.add_task(self.label, total=self.total, rate="-", extra="")
        self._bar.start()

    def line(self) -> str:
        """The plain-text form of the current state."""
        elapsed = time.monotonic() - self._start
        count = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        extra = f"  {self.extra}" if self.extra else ""
        return f"{self.label}: {count} {self.unit}{pct}  {_rate(self.done, elapsed)}{extra}  {elapsed:.1f}s"

    def update(self, done: int, extra: str = "") -> None:
        self.done = done
        self.extra = extra
        if not self.enabled:
            return
        now = time.monotonic()
        if self._bar is not None:
            self._bar.update(self._task, completed=done, rate=_rate(done, now - self._start), extra=extra)
        elif now - self._last_plain >= self.plain_every_s:
            self._last_plain = now
            self._write(self.line())

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done,
                             rate=_rate(self.done, time.monotonic() - self._start), extra=self.extra)
            self._bar.stop()
            self._bar = None
        elif self.forced:
            self._write(self.line())
