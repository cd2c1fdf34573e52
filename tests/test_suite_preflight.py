"""The suite refuses to start on a nearly full temp disk, with a message that says so (conftest
`pytest_sessionstart`), instead of failing test after test on ENOSPC."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pytest(min_free_mb: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, EQUEUE_TEST_MIN_FREE_MB=min_free_mb)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_bench_latency_stamps.py::test_warm_up_bodies_are_not_counted"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_disk_with_less_free_than_needed_stops_the_run_at_once_and_says_why():
    r = _pytest(str(1 << 40))  # more MiB than any disk has
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "the test suite needs" in out and "TMPDIR" in out and "passed" not in out


def test_enough_free_space_runs_the_tests():
    r = _pytest("0")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
