"""Hostile input against a real broker: random headers for every request code, and many
connections writing garbage while well-behaved clients work on, with stored data untouched."""

from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue_core import frame
from equeue_core.client import AdminClient, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.codes import Code
from equeue_core.errors import EQueueError
from equeue_core.frame import Frame
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import consume

FIELDS = ["topic", "queue_id", "offset", "group", "client_id", "max_count", "tags", "hold_ms", "strict",
          "offsets", "queues", "msg_id", "to", "ts_ms", "create", "subscriptions", "mode", "delay_level",
          "deliver_at", "max_reconsume", "system"]
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=20) | st.sampled_from(["hostile", "t0", "%DLQ%x", "earliest"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
headers = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


@pytest.fixture(scope="module")
def hostile_broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    cfg = d / "b.toml"
    cfg.write_text("frame_read_timeout_s = 1.0\n")
    b = BrokerProcess(d / "data", config=str(cfg)).start()
    try:
        with Producer(b.address) as p:
            p.send_batch([Message("precious", f"keep-{i}".encode()) for i in range(500)], routing_key="k")
            p.send_batch([Message("hostile", b"target of random requests") for _ in range(50)])
        yield b
    finally:
        b.stop()


def _snapshot(address: str, topic: str) -> list[tuple[int, int, bytes]]:
    with AdminClient(address) as admin:
        out = []
        for q, (lo, hi) in enumerate(admin.queue_ranges(topic)):
            out += [(q, m.queue_offset, m.body) for m in admin.read_queue(topic, q, lo, hi - lo)]
        return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(code=st.sampled_from(sorted(int(c) for c in Code)), header=headers, body=st.binary(max_size=200))
def test_every_request_handler_answers_hostile_headers_with_a_typed_error(hostile_broker, code, header, body):
    if isinstance(header.get("hold_ms"), int):
        header["hold_ms"] = 0  # a valid pull would otherwise be held (that is its job, not a hang)
    if code == Code.PULL and "hold_ms" not in header:
        header["hold_ms"] = 0

    async def go():
        conn = await BrokerConnection(hostile_broker.address).connect()
        try:
            return await conn.request(code, header, body, timeout=10)
        finally:
            await conn.close()

    try:
        run_sync(go())
    except EQueueError as e:
        assert e.code != "internal" and type(e) is not EQueueError, f"untyped error for {code}: {e}"


def _garbage_client(port: int, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    good = frame.encode_bytes(Frame(Code.SEND, 1, 0, {"topic": "precious", "queue_id": 0}, b"\x00" * 80))
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                kind = rng.randrange(5)
                if kind == 0:
                    s.sendall(os.urandom(rng.randrange(1, 4096)))
                elif kind == 1:
                    s.sendall(good[: rng.randrange(1, len(good))])  # half a frame, then hang up
                elif kind == 2:
                    bad = bytearray(good)
                    bad[rng.randrange(4, len(bad))] ^= 0xFF  # one flipped byte past the length
                    s.sendall(bad)
                elif kind == 3:
                    s.sendall(struct.pack("<I", rng.randrange(2**32)) + os.urandom(64))
                else:
                    s.sendall(good[:30])  # a head, then nothing: slow-loris for a moment
                    time.sleep(0.05)
        except OSError:
            pass


def test_garbage_from_many_connections_leaves_clients_and_data_alone(hostile_broker):
    before = _snapshot(hostile_broker.address, "precious")
    stop = threading.Event()
    attackers = [threading.Thread(target=_garbage_client, args=(hostile_broker.port, i, stop)) for i in range(12)]
    for t in attackers:
        t.start()
    try:
        with Producer(hostile_broker.address) as p:
            for i in range(20):
                p.send_batch([Message("bystander", f"b{i}-{j}".encode()) for j in range(100)])
        col = consume(hostile_broker.address, "bystanders", "bystander", 2000, timeout=60)
    finally:
        stop.set()
        for t in attackers:
            t.join(10)
    assert sorted(b for *_, b in col.items) == sorted(f"b{i}-{j}".encode() for i in range(20) for j in range(100))
    assert _snapshot(hostile_broker.address, "precious") == before, "garbage changed stored data"


def test_a_stalled_half_frame_is_closed_after_the_read_timeout(hostile_broker):
    head = frame.encode_bytes(Frame(Code.BROKER_INFO, 1, 0, {"x": "y" * 100}))
    with socket.create_connection(("127.0.0.1", hostile_broker.port), timeout=10) as s:
        s.sendall(head[:25])
        start = time.monotonic()
        s.settimeout(10)
        assert s.recv(1) == b""  # the broker hung up on us
        assert time.monotonic() - start < 8
    with AdminClient(hostile_broker.address) as admin:
        assert admin.broker_info()["store"] == "file"
