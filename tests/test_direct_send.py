"""A synchronous `Producer.send` works in the caller's own thread (client/direct.py): it must not
depend on the client's background loop thread getting time, keep order with earlier `send_async`
messages, sign like the loop path, and survive a broker that went away between sends."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from equeue_core.client import Consumer, Message, Producer
from equeue_core.client.loop import background_loop
from equeue_core.errors import ConnectionLostError, RequestTimeoutError
from tests.helpers.broker import BrokerProcess
from tests.helpers.waiting import wait_until


def _block_loop_thread() -> threading.Event:
    """Park the client's background loop thread (as a starved or stuck loop would be) until the
    returned event is set."""
    release = threading.Event()
    parked = threading.Event()

    def park() -> None:
        parked.set()
        release.wait(60)

    background_loop().call_soon_threadsafe(park)
    assert parked.wait(10)
    return release


@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_send_completes_while_the_client_loop_thread_is_stuck(tmp_path, transport):
    b = BrokerProcess(tmp_path / "data", transport=transport).start()
    try:
        with Producer(b.address) as p:
            p.send(Message("direct", b"warm-up"))
            release = _block_loop_thread()
            try:
                results = [p.send(Message("direct", f"m{i}".encode()), timeout=10) for i in range(20)]
            finally:
                release.set()
        assert [r.topic for r in results] == ["direct"] * 20
        assert len({(r.queue_id, r.queue_offset) for r in results}) == 20
    finally:
        b.stop()


def test_send_after_send_async_on_one_key_is_stored_after_them(file_broker):
    with Producer(file_broker.address, linger_ms=50) as p:
        futures = [p.send_async(Message("ordered", f"a{i}".encode()), routing_key="k") for i in range(50)]
        last = p.send(Message("ordered", b"last"), routing_key="k")
        earlier = [f.result(30) for f in futures]
    assert {r.queue_id for r in earlier} == {last.queue_id}
    assert last.queue_offset > max(r.queue_offset for r in earlier)


def test_send_goes_on_after_the_broker_restarted_between_sends(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with Producer(b.address) as p:
            first = p.send(Message("restart", b"before"))
            b.stop()
            b = BrokerProcess(tmp_path / "data", port=b.port).start()
            second = p.send(Message("restart", b"after"))
        assert second.msg_id != first.msg_id
    finally:
        b.stop()


def test_a_caller_that_spins_between_sends_still_gets_them_delivered(file_broker):
    """The sending thread never sleeps or blocks except inside send: every message is still
    acknowledged and consumed (bounds are generous: this checks delivery, not speed)."""
    count = 200
    got: list[bytes] = []
    lock = threading.Lock()

    def handler(m) -> None:
        with lock:
            got.append(bytes(m.body))

    with Producer(file_broker.address) as p:
        p.send(Message("spin", b"warm-up"))
        c = Consumer("spinners", file_broker.address, consume_from="first").subscribe("spin")
        c.start(handler)
        try:
            sent = []
            for i in range(count):
                until = time.perf_counter() + 0.0005
                while time.perf_counter() < until:  # busy: computes between sends, never idle
                    pass
                sent.append(p.send(Message("spin", f"s{i}".encode()), timeout=30))
            assert len(sent) == count
            assert wait_until(lambda: len(got) >= count + 1, timeout=60)
        finally:
            c.close()
    assert {f"s{i}".encode() for i in range(count)} <= set(got)


def test_a_blocking_connection_reads_an_answer_larger_than_one_receive(file_broker):
    """The blocking connection's usual answer fits one recv; one that does not (a pull answer of
    ~200 KiB here) is still read whole, and the connection stays in step for the next request."""
    from equeue_plugins.transport_tcp.blocking import RECV_SIZE

    from equeue_core import frame, record
    from equeue_core.client.address import parse_address
    from equeue_core.codes import Code
    from equeue_core.contracts import TransportSettings
    from equeue_core.plugins import get_plugin_manager

    with Producer(file_broker.address) as p:
        queue_id = p.send_batch([Message("wide-answer", b"w" * 1000) for _ in range(200)], routing_key="k")[0].queue_id
    address = parse_address(file_broker.address)
    conn = get_plugin_manager().transport("tcp").connect_blocking(address.host, address.port, TransportSettings())
    try:
        for _ in range(2):
            pull = frame.Frame(Code.PULL, header={"group": "g", "topic": "wide-answer", "queue_id": queue_id,
                                                  "offset": 0, "max_count": 200, "hold_ms": 0})
            answer = conn.request(pull, 10)
            assert not answer.is_error, answer.header
            assert len(answer.body) > RECV_SIZE
            assert len(record.scan(answer.body)) == answer.header["count"] == 200
    finally:
        conn.close()


def test_a_send_to_a_hung_or_stopped_broker_fails_with_the_typed_error_of_its_last_try(tmp_path):
    """After its retries a direct send raises what the last try met (as the loop path does):
    RequestTimeoutError from a broker that does not answer, ConnectionLostError from one that is
    gone -- not a bare TransportError a caller cannot tell apart."""
    b = BrokerProcess(tmp_path / "data").start()
    pid = b.proc.pid
    try:
        with Producer(b.address, send_timeout=0.5, retries=1) as p:
            p.send(Message("typed", b"warm-up"))
            os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(RequestTimeoutError):
                    p.send(Message("typed", b"x"))
                with pytest.raises(RequestTimeoutError):
                    p.send_batch([Message("typed", b"y")])
            finally:
                os.kill(pid, signal.SIGCONT)
            b.stop()
            with pytest.raises(ConnectionLostError):
                p.send(Message("typed", b"z"))
    finally:
        b.stop()


def test_send_batch_after_send_async_on_one_key_is_stored_after_them(file_broker):
    with Producer(file_broker.address, linger_ms=50) as p:
        futures = [p.send_async(Message("ordered-batch", f"a{i}".encode()), routing_key="k") for i in range(50)]
        batch = p.send_batch([Message("ordered-batch", f"b{i}".encode()) for i in range(10)], routing_key="k")
        earlier = [f.result(30) for f in futures]
    assert {r.queue_id for r in earlier} == {r.queue_id for r in batch}
    assert [r.queue_offset for r in batch] == list(range(batch[0].queue_offset, batch[0].queue_offset + 10))
    assert batch[0].queue_offset > max(r.queue_offset for r in earlier)
