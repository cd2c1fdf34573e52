"""A flush=sync send whose fsync fails is answered with the store's error, never acknowledged:
one-by-one sends and concurrent ones (several waiting on one group-commit fsync) alike, on every
transport. The fsync that fails is a real one: the broker runs under strace, which makes every
fdatasync of the broker return EIO (`-e inject`); the commit log syncs with fdatasync
(plugins/store_file/commit_log.py), so no send can become durable, and none may be answered "ok".
"""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from equeue_core.client import Message, Producer
from equeue_core.errors import StoreError
from tests.conftest import installed
from tests.helpers.broker import BrokerProcess

SENDERS = 4


@pytest.mark.slow
@pytest.mark.parametrize("transport", [t for t in installed("equeue_transports") if t != "tls"])
def test_sync_send_whose_fsync_fails_is_answered_with_an_error_never_an_ack(tmp_path, transport):
    strace = shutil.which("strace")
    assert strace, "strace is missing: `make system-deps` installs it (Makefile DEBIAN_TEST_PACKAGES)"
    b = BrokerProcess(tmp_path / "data", transport=transport, flush="sync",
                      prefix=[strace, "-f", "-qq", "-o", os.devnull, "-e", "trace=fdatasync",
                              "-e", "inject=fdatasync:error=EIO"])
    b.start(timeout=120)
    acked: list[int] = []
    errors: list[StoreError] = []
    other: list[BaseException] = []
    lock = threading.Lock()

    def send(k: int, count: int) -> None:
        with Producer(b.address, send_timeout=60, retries=0) as p:
            for n in range(count):
                try:
                    r = p.send(Message("lost", f"s{k}-{n}".encode()))
                except StoreError as e:
                    with lock:
                        errors.append(e)
                except BaseException as e:  # noqa: BLE001 - reported below
                    with lock:
                        other.append(e)
                else:
                    with lock:
                        acked.append(r.queue_offset)

    try:
        send(0, 5)  # one by one: each waits alone for its fsync
        threads = [threading.Thread(target=send, args=(k, 10)) for k in range(1, SENDERS + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    finally:
        b.stop()  # under strace: signals the broker itself, so strace ends with it
    assert not acked, f"{len(acked)} sends acknowledged although no fsync succeeded"
    assert not other, f"sends failed otherwise than with the store's error: {other[:3]!r}"
    assert len(errors) == 5 + SENDERS * 10
    assert all("flush to disk failed" in str(e) for e in errors), str(errors[0])
