"""The frame fuzzers of test_broker_hostile.py against an ACL-enabled broker, reached three ways: plain
TCP, TLS (a client that passed the TLS handshake) and ZeroMQ with CURVE (a client whose key the
broker allows). Random headers (with and without forged `auth` fields) for every request code, and
garbage from many connections inside each channel, never get past the ACL check: every answer is a
typed refusal and nothing is stored or changed."""

from __future__ import annotations

import os
import random
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue_core import curve_keys
from equeue_core import frame as framing
from equeue_core.client import AdminClient, Message, Producer
from equeue_core.codes import Code
from equeue_core.frame import Frame
from tests.helpers.accounts import ADMIN_ONLY, ROOT
from tests.helpers.broker import BrokerProcess
from tests.helpers.certs import make_certs
from tests.helpers.curve import make_curve_keys
from tests.test_acl import raw_request
from tests.test_broker_hostile import _garbage_client, headers, values

ACL = ADMIN_ONLY
REFUSALS = {"access_denied", "unknown_request", "protocol"}

forged_auth = st.fixed_dictionaries({}, optional={
    "ak": st.sampled_from([ROOT[0], "nobody", ""]) | values,
    "ts": st.integers(-(2**63), 2**64 - 1) | values,
    "nonce": st.binary(min_size=16, max_size=16) | values,
    "sig": st.binary(min_size=32, max_size=32) | values,
}) | values


@dataclass
class Channel:
    """An ACL broker and the way raw frames reach it: `request` sends one encoded frame on a fresh
    connection and returns the answer; `garbage` keeps sending junk inside the channel until
    `stop`; `creds` are the root client's transport credentials."""

    kind: str
    broker: BrokerProcess
    creds: dict[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None
    curve: dict[str, bytes] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.broker.address

    def request(self, data: bytes) -> Frame:
        if self.kind == "tcp":
            return raw_request(self.broker.port, data)
        if self.kind == "tls":
            with self._tls_socket() as s:
                s.sendall(data)
                return _read_frame(s)
        with self._dealer() as d:
            d.send(data)
            assert d.poll(10_000), "no answer over CURVE within 10 s"
            return framing.decode(b"".join(d.recv_multipart()))

    def garbage(self, seed: int, stop: threading.Event) -> None:
        if self.kind == "tcp":
            return _garbage_client(self.broker.port, seed, stop)
        rng = random.Random(seed)
        good = framing.encode_bytes(Frame(Code.SEND, 1, 0, {"topic": "precious", "queue_id": 0}, b"\x00" * 80))
        while not stop.is_set():
            flipped = bytearray(good)
            flipped[rng.randrange(4, len(flipped))] ^= 0xFF  # one flipped byte past the length
            junk = [os.urandom(rng.randrange(1, 4096)), good[: rng.randrange(1, len(good))], bytes(flipped)]
            try:
                if self.kind == "tls":
                    with self._tls_socket(timeout=2) as s:
                        s.sendall(rng.choice(junk))
                else:
                    with self._dealer() as d:
                        d.send(rng.choice(junk))
                        time.sleep(0.01)
            except OSError:
                pass

    def _tls_socket(self, timeout: float = 10) -> ssl.SSLSocket:
        assert self.tls is not None
        raw = socket.create_connection(("127.0.0.1", self.broker.port), timeout=timeout)
        return self.tls.wrap_socket(raw, server_hostname="127.0.0.1")

    def _dealer(self):
        import zmq

        d = zmq.Context.instance().socket(zmq.DEALER)
        d.linger = 0
        d.curve_serverkey = self.curve["server"]
        d.curve_publickey, d.curve_secretkey = self.curve["public"], self.curve["secret"]
        d.connect(f"tcp://127.0.0.1:{self.broker.port}")
        return d


def _read_frame(s: socket.socket) -> Frame:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + framing.frame_length(buf[:4]):
        chunk = s.recv(65536)
        assert chunk, "the broker closed the connection without an answer"
        buf += chunk
    return framing.decode(buf)


def _channel(kind: str, d: Path, acl: Path, cfg: Path) -> Channel:
    extra = ["--acl-file", str(acl)]
    if kind == "tcp":
        return Channel(kind, BrokerProcess(d / "data", config=str(cfg), extra_args=extra))
    if kind == "tls":
        certs = make_certs(d / "certs")
        extra += ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
        return Channel(kind, BrokerProcess(d / "data", transport="tls", config=str(cfg), extra_args=extra),
                       {"tls_ca": str(certs.ca)}, ssl.create_default_context(cafile=str(certs.ca)))
    keys = make_curve_keys(d / "keys")
    public, secret = curve_keys.key_pair(str(keys.client[1]))
    return Channel(kind, BrokerProcess(d / "data", transport="zmq", config=str(cfg),
                                       extra_args=extra + keys.broker_args()),
                   keys.client_credentials(),
                   curve={"server": curve_keys.public_key(str(keys.server[0])).encode(), "public": public.encode(),
                          "secret": secret.encode()})


@pytest.fixture(scope="module", params=["tcp", "tls", "zmq+curve"])
def acl_hostile_broker(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("acl-hostile")
    acl = d / "acl.toml"
    acl.write_text(ACL)
    cfg = d / "b.toml"
    cfg.write_text("frame_read_timeout_s = 1.0\n")
    channel = _channel(request.param, d, acl, cfg)
    channel.broker.start()
    try:
        with Producer(channel.address, access_key=ROOT[0], secret_key=ROOT[1], **channel.creds) as p:
            p.send_batch([Message("precious", f"keep-{i}".encode()) for i in range(100)], routing_key="k")
        yield channel
    finally:
        channel.broker.stop()


def _state(c: Channel) -> tuple:
    with AdminClient(c.address, access_key=ROOT[0], secret_key=ROOT[1], **c.creds) as a:
        topics = a.topics(system=True)
        groups = a.groups()
    return ({t: v["ranges"] for t, v in topics.items()}, sorted(groups))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(code=st.sampled_from(sorted(int(c) for c in Code)), header=headers, auth=forged_auth,
       with_auth=st.booleans(), body=st.binary(max_size=200))
def test_fuzzed_requests_to_an_acl_broker_are_all_refused(acl_hostile_broker, code, header, auth, with_auth, body):
    if with_auth:
        header["auth"] = auth
    resp = acl_hostile_broker.request(framing.encode_bytes(Frame(code, 1, 0, header, body)))
    assert resp.is_error and resp.header["error"] in REFUSALS, (code, resp.header)


def test_garbage_and_fuzzing_leave_an_acl_broker_unchanged(acl_hostile_broker):
    before = _state(acl_hostile_broker)
    stop = threading.Event()
    attackers = [threading.Thread(target=acl_hostile_broker.garbage, args=(i, stop)) for i in range(6)]
    for t in attackers:
        t.start()
    try:
        for i in range(200):  # unsigned but well-formed sends of every kind
            body = bytes(Message("precious", os.urandom(8)).encode(0))
            resp = acl_hostile_broker.request(
                framing.encode_bytes(Frame(Code.SEND, i, 0, {"topic": "precious", "queue_id": 0}, body)))
            assert resp.header["error"] == "access_denied"
    finally:
        stop.set()
        for t in attackers:
            t.join(10)
    assert _state(acl_hostile_broker) == before
