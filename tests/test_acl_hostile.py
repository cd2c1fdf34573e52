"""The frame fuzzers of test_broker_hostile.py against an ACL-enabled broker: random headers (with
and without forged `auth` fields) for every request code, and garbage from many connections,
never get past the check: every answer is a typed refusal and nothing is stored or changed."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue_core import frame as framing
from equeue_core.client import AdminClient, Message, Producer
from equeue_core.codes import Code
from equeue_core.frame import Frame
from tests.helpers.broker import BrokerProcess
from tests.test_acl import raw_request
from tests.test_broker_hostile import _garbage_client, headers, values

ROOT = ("root", "root-secret-0001")
ACL = f"""
[[accounts]]
access_key = "{ROOT[0]}"
secret_key = "{ROOT[1]}"
topics = ["*"]
groups = ["*"]
admin = true
"""
REFUSALS = {"access_denied", "unknown_request", "protocol"}

forged_auth = st.fixed_dictionaries({}, optional={
    "ak": st.sampled_from([ROOT[0], "nobody", ""]) | values,
    "ts": st.integers(-(2**63), 2**64 - 1) | values,
    "nonce": st.binary(min_size=16, max_size=16) | values,
    "sig": st.binary(min_size=32, max_size=32) | values,
}) | values


@pytest.fixture(scope="module")
def acl_hostile_broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("acl-hostile")
    acl = d / "acl.toml"
    acl.write_text(ACL)
    cfg = d / "b.toml"
    cfg.write_text("frame_read_timeout_s = 1.0\n")
    b = BrokerProcess(d / "data", config=str(cfg), extra_args=["--acl-file", str(acl)]).start()
    try:
        with Producer(b.address, access_key=ROOT[0], secret_key=ROOT[1]) as p:
            p.send_batch([Message("precious", f"keep-{i}".encode()) for i in range(100)], routing_key="k")
        yield b
    finally:
        b.stop()


def _state(b) -> tuple:
    with AdminClient(b.address, access_key=ROOT[0], secret_key=ROOT[1]) as a:
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
    resp = raw_request(acl_hostile_broker.port, framing.encode_bytes(Frame(code, 1, 0, header, body)))
    assert resp.is_error and resp.header["error"] in REFUSALS, (code, resp.header)


def test_garbage_and_fuzzing_leave_an_acl_broker_unchanged(acl_hostile_broker):
    before = _state(acl_hostile_broker)
    stop = threading.Event()
    attackers = [threading.Thread(target=_garbage_client, args=(acl_hostile_broker.port, i, stop)) for i in range(6)]
    for t in attackers:
        t.start()
    try:
        for i in range(200):  # unsigned but well-formed sends of every kind
            body = bytes(Message("precious", os.urandom(8)).encode(0))
            resp = raw_request(acl_hostile_broker.port,
                               framing.encode_bytes(Frame(Code.SEND, i, 0, {"topic": "precious", "queue_id": 0},
                                                          body)))
            assert resp.header["error"] == "access_denied"
    finally:
        stop.set()
        for t in attackers:
            t.join(10)
    assert _state(acl_hostile_broker) == before
