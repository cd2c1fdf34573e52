"""Run one of bench/'s scripts the way a user does (`python -m bench.<name> ...`, in its own
process) and return its JSON rows; the tests that keep the benchmarks runnable share it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def bench_rows(module: str, *args: str, timeout: float = 300) -> list[dict]:
    """The JSON rows of one `python -m <module> <args>` run, which must succeed."""
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
