"""Starting the client's loop thread lowers the interpreter's switch interval, so a thread that
computes between sends hands the GIL to the loop thread in sub-millisecond steps instead of 5 ms
ones; EQUEUE_SWITCH_INTERVAL_MS tunes it and 0 leaves the interpreter's setting alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import sys; before = sys.getswitchinterval(); "
         "from equeue_core.client.loop import background_loop; background_loop(); "
         "print(before, sys.getswitchinterval())")


def _probe(env_value: str | None) -> tuple[float, float]:
    env = dict(os.environ)
    env.pop("EQUEUE_SWITCH_INTERVAL_MS", None)
    if env_value is not None:
        env["EQUEUE_SWITCH_INTERVAL_MS"] = env_value
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    before, after = map(float, r.stdout.split())
    return before, after


@pytest.mark.parametrize(("value", "expected"), [(None, 0.0005), ("0.2", 0.0002)])
def test_the_client_loop_lowers_the_switch_interval(value, expected):
    before, after = _probe(value)
    assert before == 0.005
    assert after == pytest.approx(expected)


@pytest.mark.parametrize("value", ["0", "50", "not-a-number-falls-back"])
def test_the_switch_interval_is_never_raised_and_zero_leaves_it(value):
    before, after = _probe(value)
    if value == "0":
        assert after == before
    elif value == "50":
        assert after == before  # 50 ms would raise it: left alone
    else:
        assert after == pytest.approx(0.0005)
