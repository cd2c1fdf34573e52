"""bench/child.py: a benchmark role's child process either gives its last JSON line or fails
saying how it ended (exit code, or the killing signal by name) with the end of its stderr."""

from __future__ import annotations

import sys

import pytest

from bench.child import exit_reason, role_result


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_last_json_line_is_the_result(tmp_path):
    out = role_result(_py("print('warming up'); print('{\"rate\": 5}')"), what="role x", cwd=tmp_path, timeout=60)
    assert out == {"rate": 5}


def test_a_child_that_exits_non_zero_says_its_code_and_stderr(tmp_path):
    with pytest.raises(RuntimeError, match=r"^role x exited with 3: boom$"):
        role_result(_py("import sys; sys.stderr.write('boom\\n'); sys.exit(3)"), what="role x", cwd=tmp_path,
                    timeout=60)


def test_a_child_killed_by_a_signal_names_it(tmp_path):
    """The case that once raised an empty error: a sender that died of SIGSEGV at exit."""
    with pytest.raises(RuntimeError, match=r"^role sender died of SIGSEGV: $"):
        role_result(_py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), what="role sender",
                    cwd=tmp_path, timeout=60)


def test_exit_reason_of_an_unknown_signal():
    assert exit_reason(-99) == "died of signal 99"
    assert exit_reason(2) == "exited with 2"
