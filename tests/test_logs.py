"""Broker logs: text by default, one JSON object a line with --log-format json; the start says
what recovery did (every RecoveryReport field)."""

from __future__ import annotations

import json

import pytest

from equeue_core.client import Message, Producer
from tests.helpers.broker import BrokerProcess


def _recovery_lines(text: str) -> list[dict]:
    records = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    return [r for r in records if "recovery" in r]


@pytest.mark.failure
def test_json_logs_carry_the_recovery_report_of_each_start_crash_included(tmp_path):
    b = BrokerProcess(tmp_path / "data", env={"EQUEUE_LOG_FORMAT": "json"}).start()
    try:
        with Producer(b.address) as p:
            p.send_batch([Message("t", b"x" * 100) for _ in range(500)])
        b.kill()
        b.start()
    finally:
        b.stop()
    first, second = _recovery_lines(b.log_path.read_text())
    assert first["recovery"]["clean"] is True and first["level"] == "info"
    after_crash = second["recovery"]
    assert after_crash["clean"] is False and second["level"] == "warning"
    assert set(after_crash) == {"clean", "truncated_bytes", "rebuilt_entries", "records", "notes", "seconds"}
    assert second["logger"] == "equeue.broker" and "recovery after a crash" in second["msg"]
    assert second["ts"].endswith("+00:00")


def test_text_logs_by_default_say_what_recovery_did(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    b.stop()
    log = b.log_path.read_text()
    assert " INFO equeue.broker: recovery: the last stop was clean; store opened in" in log
    assert not log.lstrip().startswith("{")


def test_a_bad_log_format_is_one_line(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "broker", "--data-dir", str(tmp_path / "d"),
                        "--port", "0", "--metrics-port", "0"], capture_output=True, text=True, timeout=60,
                       env={"EQUEUE_LOG_FORMAT": "yaml", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and "config log_format: 'yaml' must be 'text' or 'json'" in r.stderr
