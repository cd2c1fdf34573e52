"""`equeue stats` and the progress bars, as a person sees them: in a real terminal (tmux), and piped."""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from equeue_core.cli.progress import ProgressReport
from equeue_core.client import AdminClient, LitePullConsumer, Message, Producer

ROOT = Path(__file__).resolve().parent.parent


class Tmux:
    """A tmux server of our own (private socket), one window running a command; killed on close."""

    def __init__(self, command: list[str], width: int = 160, height: int = 50) -> None:
        if shutil.which("tmux") is None:
            pytest.fail("tmux is not installed: run `make system-deps`")
        self.socket = f"equeue-test-{uuid.uuid4().hex[:8]}"
        # The shell stays a while after the command ends, so its last screen can still be read.
        line = f"cd {shlex.quote(str(ROOT))} && env TERM=xterm-256color {shlex.join(command)}; sleep 60"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), line)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t")

    def wait_for(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never showed; the screen:\n{screen}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _equeue(*args: str) -> list[str]:
    return [sys.executable, "-m", "equeue_core.cli.main", *args]


def _stored(screen: str, topic: str) -> int:
    """The `stored` column of a topic's row in the stats table."""
    for line in screen.splitlines():
        cells = line.split()
        if cells and cells[0] == topic:
            return int(cells[-2].replace(",", ""))
    raise AssertionError(f"no row for {topic}:\n{screen}")


def test_stats_in_a_terminal_shows_the_table_and_refreshes_while_a_producer_runs(file_broker):
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("orders", 4)
    stop = threading.Event()

    def produce() -> None:
        with Producer(file_broker.address) as p:
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                p.send_batch([Message("orders", b"x" * 64) for _ in range(200)])
                time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    tmux = Tmux(_equeue("stats", "--broker", file_broker.address, "--interval", "0.5"))
    try:
        first = tmux.wait_for(r"(?m)^\s*orders\s+4\s")
        assert "topics" in first and "consumer groups" in first and "latency" in first
        assert "broker 127.0.0.1:" in first and "disk free" in first
        before = _stored(first, "orders")
        deadline = time.monotonic() + 30
        after = before
        while after == before and time.monotonic() < deadline:
            time.sleep(0.3)
            after = _stored(tmux.screen(), "orders")
        assert after > before, "the table did not refresh while messages flowed"
        rate = next(line for line in tmux.screen().splitlines() if line.split()[:1] == ["orders"]).split()[2]
        assert rate != "-"
    finally:
        stop.set()
        tmux.close()
        producer.join(30)


def test_stats_once_off_a_terminal_prints_rates_and_group_lag(file_broker):
    with Producer(file_broker.address) as p:
        p.send_batch([Message("orders", b"x") for _ in range(400)])
    # The group commits half of each queue, so its lag is known exactly; a consumer left running
    # would make it anything from 0 to 400 (its first pull asks for the whole backlog).
    with AdminClient(file_broker.address) as admin:
        ends = [end for _, end in admin.queue_ranges("orders")]
    with LitePullConsumer("billing", file_broker.address, auto_commit=False) as c:
        c.assign("orders")
        for queue_id, end in enumerate(ends):
            c.seek("orders", queue_id, end // 2)
        c.commit()
    lag = sum(end - end // 2 for end in ends)
    assert 0 < lag < 400, ends
    r = subprocess.run(_equeue("stats", "--broker", file_broker.address, "--interval", "0.2", "--once"),
                       capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "150"})
    assert r.returncode == 0, r.stderr
    assert re.search(r"orders\s+4\s+\S+\s+\S+\s+\S+ B\s+\S+ B\s+400\s", r.stdout), r.stdout
    row = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["billing"])
    assert int(row.split()[2].replace(",", "")) == lag, r.stdout


def test_produce_in_a_terminal_draws_a_progress_bar_with_its_rate(file_broker):
    tmux = Tmux(_equeue("produce", "--broker", file_broker.address, "--topic", "bulk", "--count", "200000",
                        "--batch", "500"))
    try:
        screen = tmux.wait_for(r"produce bulk.*msgs.*[\d,]+/s", timeout=120)
        assert "/200000 msgs" in screen
    finally:
        tmux.close()


def test_progress_off_a_terminal_is_a_plain_line_with_the_rate():
    out = io.StringIO()
    report = ProgressReport(1000, "produce t", enabled=None, stream=out, plain_every_s=0)
    report.update(500)
    report.update(1000)
    report.finish()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("produce t: 500/1,000 msgs (50%)") and "/s" in lines[0]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    quiet = io.StringIO()
    ProgressReport(1000, "x", enabled=None, stream=quiet).update(10)  # a short run stays quiet
    assert quiet.getvalue() == ""


def test_consume_quiet_in_a_terminal_draws_a_progress_bar_with_its_rate(file_broker):
    with Producer(file_broker.address) as p:
        for _ in range(20):
            p.send_batch([Message("drain", b"x" * 32) for _ in range(1000)])
    tmux = Tmux(_equeue("consume", "--broker", file_broker.address, "--topic", "drain", "--group", "d",
                        "--count", "20000", "--quiet"))
    try:
        screen = tmux.wait_for(r"consume drain.*/20000 msgs.*[\d,]+/s", timeout=120)
        assert "━" in screen  # the bar itself
        tmux.wait_for(r"(?m)^20000$", timeout=120)  # --quiet prints the count at the end
    finally:
        tmux.close()
