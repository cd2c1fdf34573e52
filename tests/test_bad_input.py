"""Bad input gets a typed error, and the broker goes on serving everyone else."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys

import pytest

from equeue_core import frame, record
from equeue_core.client import AdminClient, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.codes import Code
from equeue_core.errors import (
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    ProtocolError,
    QueueNotFoundError,
    TopicNotFoundError,
    UnknownRequestError,
)
from tests.helpers.consume import consume


def _still_serves(address: str) -> None:
    with Producer(address) as p:
        p.send_batch([Message("healthy", f"h{i}".encode()) for i in range(50)])
    col = consume(address, "health-check", "healthy", 50, timeout=30)
    assert len(col.items) >= 50


def _raw(port: int, data: bytes, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        if not read:
            return b""
        s.settimeout(3)
        try:
            return s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            return b""


def test_garbage_and_truncated_frames_do_not_hurt_other_clients(file_broker):
    port = file_broker.port
    _raw(port, b"\xff" * 64, read=False)  # a length no frame can have
    _raw(port, struct.pack("<I", 100) + b"\x00" * 10, read=False)  # truncated, then closed
    bad_magic = bytearray(frame.encode_bytes(frame.Frame(Code.BROKER_INFO, 7, 0, {})))
    bad_magic[4] = 0
    _raw(port, bytes(bad_magic))
    good = frame.encode_bytes(frame.Frame(Code.BROKER_INFO, 9, 0, {}))
    reply = _raw(port, good)
    assert frame.decode(reply).request_id == 9
    _still_serves(file_broker.address)


def _request(address: str, code: int, header: dict, body: bytes = b""):
    async def go():
        conn = await BrokerConnection(address).connect()
        try:
            return await conn.request(code, header, body, timeout=10)
        finally:
            await conn.close()

    return run_sync(go())


def test_oversized_message_is_refused_with_a_typed_error(file_broker):
    with Producer(file_broker.address) as p, pytest.raises(MessageTooLargeError):
        p.send(Message("big", b"x" * (4 * 1024 * 1024 + 1)))
    _still_serves(file_broker.address)


def test_invalid_topic_name_is_refused(file_broker):
    with Producer(file_broker.address) as p:
        for bad in ("", "has space", "x" * 128, "%RETRY%mine", "slash/no"):
            with pytest.raises(InvalidTopicError):
                p.send(Message(bad, b"x"))
    _still_serves(file_broker.address)


def test_pull_for_unknown_topic_or_queue_is_a_typed_error(file_broker):
    with pytest.raises(TopicNotFoundError):
        _request(file_broker.address, Code.PULL, {"group": "g", "topic": "nope", "queue_id": 0, "offset": 0})
    with Producer(file_broker.address) as p:
        p.send(Message("known", b"x"))
    with pytest.raises(QueueNotFoundError):
        _request(file_broker.address, Code.PULL, {"group": "g", "topic": "known", "queue_id": 99, "offset": 0})
    _still_serves(file_broker.address)


@pytest.mark.parametrize("field", ["topic", "queue_id", "offset", "max_count", "hold_ms"])
@pytest.mark.parametrize("value", [True, 1.0, "1", None, [0]])
def test_a_pull_field_of_the_wrong_type_is_a_protocol_error_naming_it(file_broker, field, value):
    if field == "topic" and value == "1":
        value = 1  # (a string is a topic's type)
    """pull_now reads a header of the usual types without calls: every other value must still
    get the general checks' error (a bool is not an integer; max_count and hold_ms may be
    absent, not null)."""
    with Producer(file_broker.address) as p:
        p.send(Message("typed-pull", b"x"), routing_key="k")
    header = {"group": "g", "topic": "typed-pull", "queue_id": 0, "offset": 0, "max_count": 1, "hold_ms": 0}
    header[field] = value
    if field == "topic" and value is None:
        del header["topic"]
    with pytest.raises(ProtocolError, match=repr(field)):
        _request(file_broker.address, Code.PULL, header)


def test_a_pull_count_and_hold_outside_their_bounds_are_clamped(file_broker):
    """max_count below 1 reads one record, above 4096 at most 4096; a negative hold_ms is not held."""
    with Producer(file_broker.address) as p:
        queue_id = p.send_batch([Message("clamped-pull", b"%d" % i) for i in range(5000)], routing_key="k")[0].queue_id
    header = {"group": "g", "topic": "clamped-pull", "queue_id": queue_id, "offset": 0, "hold_ms": 0}
    assert _request(file_broker.address, Code.PULL, {**header, "max_count": 0}).header["count"] == 1
    assert _request(file_broker.address, Code.PULL, {**header, "max_count": -5}).header["count"] == 1
    assert _request(file_broker.address, Code.PULL, {**header, "max_count": 10**9}).header["count"] == 4096
    empty = {**header, "offset": 5000, "max_count": 10, "hold_ms": -1}
    assert _request(file_broker.address, Code.PULL, empty).header["count"] == 0  # answered at once


def test_offset_out_of_range_is_a_typed_error(file_broker):
    with Producer(file_broker.address) as p:
        q = p.send(Message("range", b"x"), routing_key="k").queue_id
    with AdminClient(file_broker.address) as admin, pytest.raises(OffsetOutOfRangeError) as e:
        admin.read_queue("range", q, 1000, 1)
    assert e.value.max_offset == 1


def test_malformed_headers_and_batches_get_typed_errors(file_broker):
    a = file_broker.address
    with pytest.raises(ProtocolError):
        _request(a, Code.PULL, {"group": "g", "topic": "t", "queue_id": "zero", "offset": 0})
    with pytest.raises(UnknownRequestError):
        _request(a, 999, {})
    with pytest.raises(InvalidMessageError):
        _request(a, Code.SEND, {"topic": "t", "queue_id": 0}, b"\x01\x02\x03")
    other = record.encode_record("other-topic", b"x")
    with pytest.raises(InvalidMessageError):
        _request(a, Code.SEND, {"topic": "t", "queue_id": 0}, other)
    _still_serves(a)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "equeue_core.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_prints_one_line_errors_without_tracebacks(file_broker):
    r = _cli("topics", "create", "bad name!", "--broker", file_broker.address)
    assert r.returncode == 1
    assert "invalid topic name" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = _cli("consume", "--broker", "127.0.0.1:1", "--topic", "t", "--group", "g", "--count", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_cli_produce_then_consume_counts(file_broker):
    r = _cli("produce", "--broker", file_broker.address, "--topic", "cli", "--count", "5000", "--size", "64")
    assert r.returncode == 0, r.stderr
    r = _cli("consume", "--broker", file_broker.address, "--topic", "cli", "--group", "cg", "--count", "5000",
             "--quiet", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "5000"
    r = _cli("topics", "list", "--broker", file_broker.address)
    assert "cli" in r.stdout and "5000" in r.stdout


def test_cli_produce_reads_lines_from_stdin(file_broker):
    r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "produce", "--broker", file_broker.address,
                        "--topic", "lines"], input="one\ntwo\nthree\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = _cli("consume", "--broker", file_broker.address, "--topic", "lines", "--group", "lg", "--count", "3",
             "--timeout", "30")
    assert sorted(line.split("\t")[-1] for line in r.stdout.splitlines()) == ["one", "three", "two"]
