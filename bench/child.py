"""Run a benchmark role in a child process and take the one JSON line it prints last.

Every bench module runs its clients in their own processes. A child that fails says how: its
exit code, or the signal that killed it by name (a SIGSEGV at exit once showed up as an empty
error, docs/client.md "At exit"), then the end of its stderr.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path


def exit_reason(returncode: int) -> str:
    """`exited with 3`, or `died of SIGSEGV` for a process a signal ended."""
    if returncode < 0:
        try:
            return f"died of {signal.Signals(-returncode).name}"
        except ValueError:
            return f"died of signal {-returncode}"
    return f"exited with {returncode}"


def role_result(cmd: list[str], *, what: str, cwd: Path | str, timeout: float,
                env: dict[str, str] | None = None) -> dict:
    """Run `cmd` to its end; its last stdout line parsed as JSON. RuntimeError naming `what`,
    how it ended and the tail of its stderr if it failed."""
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{what} {exit_reason(r.returncode)}: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])
