"""The answer spin of the blocking tcp connection (plugins/transport_tcp/blocking.py,
ANSWER_SPIN_S): a `Producer.send` waits for the broker's answer peeking at its socket before it
blocks in recv, when it sends back to back. What it must keep: every send answered as before, the
spin caught by answers that come within it, the CPU given up while it spins, a caller that sleeps
between sends never spinning, and a connection whose answers come later (flush=sync, a far broker)
left spinning about once in SPIN_RETRY_AFTER requests, not on every one; a broker that dies while the caller spins fails the
send, and the next send reconnects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from equeue_plugins.transport_tcp import blocking

from equeue_core.client import AdminClient, Message, Producer
from equeue_core.errors import TransportError
from tests.helpers.broker import BrokerProcess, create_topic
from tests.helpers.certs import make_certs
from tests.helpers.proxy import CuttableProxy


def _conn(p: Producer) -> blocking.BlockingTcpConnection:
    direct = p._direct
    assert direct is not None, "a tcp Producer sends over its direct connection"
    return direct._conn  # type: ignore[return-value]


def _every_answer_caught(address: str, topic: str, monkeypatch, **credentials: str) -> None:
    """300 sends in a loop with a window longer than any answer of a live broker: after
    SPIN_STREAK of them each came right after the previous answer, every send spins and catches
    its answer; each send is answered once."""
    monkeypatch.setattr(blocking, "ANSWER_SPIN_S", 2.0)  # longer than any answer of a live broker
    monkeypatch.setattr(blocking, "SPIN_AFTER_S", 0.05)  # back to back even on a loaded machine
    with Producer(address, **credentials) as p:
        results = [p.send(Message(topic, f"m{i}".encode())) for i in range(300)]
        conn = _conn(p)
        assert conn.spins_missed == 0
        assert 300 - blocking.SPIN_STREAK - 2 <= conn.spins_caught <= 300 - blocking.SPIN_STREAK, conn.spins_caught
    assert len({(r.queue_id, r.queue_offset) for r in results}) == 300


def test_a_caller_sending_back_to_back_spins_and_answers_are_caught(file_broker, monkeypatch):
    _every_answer_caught(file_broker.address, create_topic(file_broker, "spin-caught", 2), monkeypatch)


def test_over_tls_the_spin_polls_and_catches_the_answers(tmp_path, monkeypatch):
    """TLS cannot peek at application bytes: the spin polls the socket's fd (and looks at what
    the TLS layer already decrypted). Same outcome as plain tcp: every answer caught, each send
    answered, nothing lost."""
    certs = make_certs(tmp_path / "certs")
    b = BrokerProcess(tmp_path / "data", extra_args=["--tls-cert", str(certs.server_cert),
                                                     "--tls-key", str(certs.server_key)]).start()
    try:
        address = f"tls://127.0.0.1:{b.port}"
        with AdminClient(address, tls_ca=str(certs.ca)) as a:
            a.create_topic("spin-tls", 2)
        _every_answer_caught(address, "spin-tls", monkeypatch, tls_ca=str(certs.ca))
    finally:
        b.stop()


def test_a_caller_that_sleeps_between_sends_never_spins(file_broker, monkeypatch):
    """A paced sender (1 ms between sends) would pay the whole spin in CPU: it never spins."""
    monkeypatch.setattr(blocking, "ANSWER_SPIN_S", 2.0)
    topic = create_topic(file_broker, "spin-paced", 1)
    with Producer(file_broker.address) as p:
        for i in range(60):
            p.send(Message(topic, f"m{i}".encode()))
            time.sleep(0.001)
        conn = _conn(p)
        assert (conn.spins_caught, conn.spins_missed) == (0, 0)


def test_a_spinning_caller_gives_its_cpu_to_the_broker_it_waits_for(file_broker, monkeypatch):
    """The caller's thread and every broker thread pinned to one CPU: the broker can answer only
    while the spinning caller lets it run. Yielding between peeks, the answers come within the
    default window; without the yield every spin ran out its window (0 caught, all missed, and
    then the credit stopped the spin)."""
    monkeypatch.setattr(blocking, "SPIN_AFTER_S", 0.05)
    topic = create_topic(file_broker, "spin-one-cpu", 1)
    assert file_broker.proc is not None
    cpu = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    for task in os.listdir(f"/proc/{file_broker.proc.pid}/task"):
        os.sched_setaffinity(int(task), {cpu})
    os.sched_setaffinity(0, {cpu})  # this thread; the producer's loop thread inherits it
    try:
        with Producer(file_broker.address) as p:
            for i in range(2000):
                p.send(Message(topic, f"m{i}".encode()))
            conn = _conn(p)
    finally:
        os.sched_setaffinity(0, saved)
    assert conn.spins_caught >= 1000, (conn.spins_caught, conn.spins_missed)
    assert conn.spins_missed * 10 < conn.spins_caught, (conn.spins_caught, conn.spins_missed)


def test_answers_that_come_later_stop_the_spin(file_broker, monkeypatch):
    """Every answer held back 2 ms by a proxy, ten times the window: after the starting credit is
    spent the connection spins only once every SPIN_RETRY_AFTER requests, each spin a miss. An
    answer caught anyway (the caller's thread kept off its CPU past the delay between its write
    and its first peek, on a loaded machine) earns a credit, worth one more try."""
    monkeypatch.setattr(blocking, "SPIN_AFTER_S", 0.05)
    topic = create_topic(file_broker, "spin-missed", 2)
    sends = 400
    proxy = CuttableProxy(file_broker.port, answer_delay=0.002)
    try:
        with Producer(proxy.address) as p:
            for i in range(sends):
                p.send(Message(topic, f"m{i}".encode()))
            conn = _conn(p)
    finally:
        proxy.close()
    caught, missed = conn.spins_caught, conn.spins_missed
    assert caught < sends // 10, (caught, missed)
    at_most = blocking.SPIN_CREDIT_MAX // blocking.SPIN_MISS_COST + sends // blocking.SPIN_RETRY_AFTER + 1 + caught
    assert 0 < missed <= at_most, (caught, missed, at_most)


def test_environment_zero_turns_the_spin_off(file_broker):
    """EQUEUE_ANSWER_SPIN_US=0 in a fresh process: no send spins."""
    topic = create_topic(file_broker, "spin-off", 1)
    code = ("from equeue_core.client import Message, Producer\n"
            f"with Producer({file_broker.address!r}) as p:\n"
            f"    [p.send(Message({topic!r}, b'x')) for _ in range(50)]\n"
            "    c = p._direct._conn\n"
            "    print(c.spins_caught, c.spins_missed)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "EQUEUE_ANSWER_SPIN_US": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "0"]


@pytest.mark.parametrize("how", ["kill", "stop-then-kill"])
def test_a_broker_that_dies_while_the_caller_spins_fails_the_send_and_a_new_one_is_used(tmp_path, monkeypatch, how):
    """kill -9 of the broker with the caller waiting (spinning 2 s, or the broker stopped first
    so the send is surely in its spin): the send raises a TransportError well before its
    timeouts run out, and once a broker listens on the port again the next send works."""
    monkeypatch.setattr(blocking, "ANSWER_SPIN_S", 2.0)
    monkeypatch.setattr(blocking, "SPIN_AFTER_S", 0.05)
    b = BrokerProcess(tmp_path / "data").start()
    try:
        topic = create_topic(b, "spin-dies", 1)
        with Producer(b.address, send_timeout=5, retries=1) as p:
            p.send(Message(topic, b"before"))
            if how == "stop-then-kill":
                os.kill(b.proc.pid, signal.SIGSTOP)
                threading.Timer(0.3, b.kill).start()
            else:
                threading.Timer(0.05, b.kill).start()
            started = time.monotonic()
            with pytest.raises(TransportError):
                for i in range(100_000):  # sending until the kill lands
                    p.send(Message(topic, f"m{i}".encode()))
            assert time.monotonic() - started < 5
            b.start()
            assert p.send(Message(topic, b"after")).topic == topic
    finally:
        b.stop()
