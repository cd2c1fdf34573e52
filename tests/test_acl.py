"""ACLs against a real broker (docs/security.md): every kind of refused request is refused with
access_denied and changes nothing; the right credentials do everything; the file reloads live."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request

import pytest

from equeue_core import frame as framing
from equeue_core import signing
from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.codes import Code
from equeue_core.errors import AccessDeniedError, ConfigError
from equeue_core.frame import Frame
from tests.helpers.accounts import APP, ROOT, account
from tests.helpers.broker import BrokerProcess, free_port
from tests.helpers.waiting import wait_until

ADMIN = ROOT
LOCAL = ("local", "local-secret-0001")
LEVELS = "200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms"

ACL = "\n".join([account(ADMIN, admin=True), account(APP, topics=["orders.*", "work", "work-pulling"],
                                                        groups=["g1", "gr", "gr-pulling"]),
                  account(LOCAL, addresses=["127.0.0.1/32"])])


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("acl")
    acl = d / "acl.toml"
    acl.write_text(ACL)
    cfg = d / "broker.toml"
    cfg.write_text(f'delay_levels = "{LEVELS}"\nacl_reload_s = 0.2\nacl_window_s = 30\n'
                   "heartbeat_expiry_s = 5\noffset_persist_ms = 200\nframe_read_timeout_s = 1.0\n")
    b = BrokerProcess(d / "data", config=str(cfg), metrics_port=free_port(),
                      extra_args=["--acl-file", str(acl)]).start()
    b.acl_path = acl  # type: ignore[attr-defined]
    try:
        with Producer(b.address, access_key=ADMIN[0], secret_key=ADMIN[1]) as p:
            p.send_batch([Message("orders.eu", f"keep-{i}".encode()) for i in range(20)], routing_key="k")
        yield b
    finally:
        b.stop()


def admin(b) -> AdminClient:
    return AdminClient(b.address, access_key=ADMIN[0], secret_key=ADMIN[1])


def ranges(b, topic: str) -> list[list[int]]:
    with admin(b) as a:
        return a.queue_ranges(topic)


def topic_names(b) -> set[str]:
    with admin(b) as a:
        return set(a.topics())


def raw_request(port: int, data: bytes, source: str = "127.0.0.1") -> Frame:
    """Send one encoded frame over a fresh socket (from `source`) and read the one answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(data)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + framing.frame_length(buf[:4]):
            chunk = s.recv(65536)
            assert chunk, "the broker closed the connection without an answer"
            buf += chunk
        return framing.decode(buf)


def signed_send(topic: str, body: bytes, ak: str, secret: str, ts_ms: int | None = None) -> bytes:
    header = {"topic": topic, "queue_id": 0}
    if ts_ms is None:
        header = signing.sign(Code.SEND, header, body, ak, secret.encode())
    else:
        nonce = os.urandom(signing.NONCE_SIZE)
        header = dict(header, auth={"ak": ak, "ts": ts_ms, "nonce": nonce,
                                    "sig": signing.signature(secret.encode(), Code.SEND, header, body, ak,
                                                             ts_ms, nonce)})
    return framing.encode_bytes(Frame(Code.SEND, 7, 0, header, body))


def one_record(topic: str, body: bytes) -> bytes:
    return bytes(Message(topic, body).encode(0))


def test_a_send_without_credentials_is_refused_and_stores_nothing(acl_broker):
    before = ranges(acl_broker, "orders.eu")
    with pytest.raises(AccessDeniedError, match="not signed"):
        with Producer(acl_broker.address) as p:
            p.send_batch([Message("orders.eu", b"sneaky")])
    assert ranges(acl_broker, "orders.eu") == before


def test_a_wrong_secret_is_refused_and_the_error_never_shows_a_secret(acl_broker):
    before = ranges(acl_broker, "orders.eu")
    with pytest.raises(AccessDeniedError) as e:
        with Producer(acl_broker.address, access_key=APP[0], secret_key="not-the-secret") as p:
            p.send_batch([Message("orders.eu", b"sneaky")])
    assert "bad signature" in str(e.value) and "'app'" in str(e.value)
    assert "not-the-secret" not in str(e.value) and APP[1] not in str(e.value)
    assert ranges(acl_broker, "orders.eu") == before
    log = acl_broker.log_path.read_text()
    assert APP[1] not in log and "not-the-secret" not in log and ADMIN[1] not in log


def test_a_replayed_signed_frame_is_refused_and_stored_once(acl_broker):
    data = signed_send("orders.replay", one_record("orders.replay", b"once"), *APP)
    first = raw_request(acl_broker.port, data)
    assert not first.is_error, first.header
    assert ranges(acl_broker, "orders.replay") == [[0, 1], [0, 0], [0, 0], [0, 0]]
    again = raw_request(acl_broker.port, data)
    assert again.is_error and again.header["error"] == "access_denied"
    assert "replayed" in again.header["message"]
    assert ranges(acl_broker, "orders.replay") == [[0, 1], [0, 0], [0, 0], [0, 0]]


def test_a_stale_timestamp_is_refused(acl_broker):
    stale = int(time.time() * 1000) - 120_000
    resp = raw_request(acl_broker.port, signed_send("orders.stale", one_record("orders.stale", b"x"), *APP,
                                                    ts_ms=stale))
    assert resp.is_error and resp.header["error"] == "access_denied"
    assert "outside the 30s window" in resp.header["message"]
    assert "orders.stale" not in topic_names(acl_broker)


def test_a_tampered_body_breaks_the_signature(acl_broker):
    data = bytearray(signed_send("orders.tamper", one_record("orders.tamper", b"original"), *APP))
    data[-3] ^= 0x01  # a byte of the record's body
    resp = raw_request(acl_broker.port, bytes(data))
    assert resp.is_error and resp.header["error"] == "access_denied" and "bad signature" in resp.header["message"]
    assert "orders.tamper" not in topic_names(acl_broker)


def test_a_topic_outside_the_accounts_rights_is_refused(acl_broker):
    with pytest.raises(AccessDeniedError) as e:
        with Producer(acl_broker.address, access_key=APP[0], secret_key=APP[1]) as p:
            p.send_batch([Message("payments", b"x")])
    assert e.value.details == {"request": "route", "account": "app", "reason": "topic", "topic": "payments"}
    # and a raw send straight to an existing topic it may not write
    resp = raw_request(acl_broker.port, signed_send("payments", one_record("payments", b"x"), *APP))
    assert resp.header["error"] == "access_denied" and "'payments'" in resp.header["message"]
    assert "payments" not in topic_names(acl_broker)


def signed_multi(sections: list[tuple[str, bytes]], ak: str, secret: str) -> bytes:
    """A SEND_MULTI of (topic, records) sections, all to queue 0, signed by `ak`."""
    body = b"".join(blob for _, blob in sections)
    header = signing.sign(Code.SEND_MULTI, {"sections": [[t, 0, len(blob)] for t, blob in sections]}, body, ak,
                          secret.encode())
    return framing.encode_bytes(Frame(Code.SEND_MULTI, 9, 0, header, body))


def test_a_send_multi_needs_the_send_right_on_every_topic_it_writes(acl_broker):
    """One section outside the account's rights refuses the whole request, naming that topic,
    and stores nothing; with every topic allowed, all sections are stored."""
    mixed = [("orders.multi", one_record("orders.multi", b"a")), ("payments", one_record("payments", b"b"))]
    resp = raw_request(acl_broker.port, signed_multi(mixed, *APP))
    assert resp.is_error and resp.header["error"] == "access_denied", resp.header
    assert resp.header["details"]["topic"] == "payments" and "'payments'" in resp.header["message"]
    assert "orders.multi" not in topic_names(acl_broker) and "payments" not in topic_names(acl_broker)
    allowed = [("orders.multi", one_record("orders.multi", b"a")), ("orders.multi2", one_record("orders.multi2", b"b"))]
    ok = raw_request(acl_broker.port, signed_multi(allowed, *APP))
    assert not ok.is_error and len(ok.header["stored"]) == 2, ok.header
    assert ranges(acl_broker, "orders.multi")[0] == [0, 1]


def test_a_group_outside_the_accounts_rights_cannot_pull_or_commit(acl_broker):
    with admin(acl_broker) as a:
        before = a.groups()

    async def go(code, header):
        conn = await BrokerConnection(acl_broker.address, access_key=APP[0], secret_key=APP[1]).connect()
        try:
            return await conn.request(code, header, timeout=10)
        finally:
            await conn.close()

    for code, header in ((Code.PULL, {"group": "other", "topic": "orders.eu", "queue_id": 0, "offset": 0,
                                      "hold_ms": 0}),
                         (Code.PULL_MULTI, {"group": "other", "pulls": [["orders.eu", 0, 0, 5, None]]}),
                         (Code.COMMIT_OFFSETS, {"group": "other", "offsets": [["orders.eu", 0, 5]]}),
                         (Code.HEARTBEAT, {"group": "other", "client_id": "c", "mode": "clustering",
                                           "subscriptions": {"orders.eu": "*"}})):
        with pytest.raises(AccessDeniedError) as e:
            run_sync(go(code, header))
        assert e.value.details["group"] == "other" and e.value.details["account"] == "app"
    with admin(acl_broker) as a:
        assert a.groups() == before and "other" not in a.groups()


def test_an_account_bound_to_127_0_0_1_is_refused_from_127_0_0_2(acl_broker):
    ok = raw_request(acl_broker.port, signed_send("orders.cidr", one_record("orders.cidr", b"a"), *LOCAL),
                     source="127.0.0.1")
    assert not ok.is_error, ok.header
    refused = raw_request(acl_broker.port, signed_send("orders.cidr", one_record("orders.cidr", b"b"), *LOCAL),
                          source="127.0.0.2")
    assert refused.header["error"] == "access_denied" and "may not connect from 127.0.0.2" in \
        refused.header["message"]
    assert sum(hi - lo for lo, hi in ranges(acl_broker, "orders.cidr")) == 1


def test_admin_requests_need_an_admin_account(acl_broker):
    with AdminClient(acl_broker.address, access_key=APP[0], secret_key=APP[1]) as a:
        for call in (lambda: a.topics(), lambda: a.create_topic("orders.admin", 2), lambda: a.stats(),
                     lambda: a.reset_offsets("g1", "orders.eu", "earliest"), lambda: a.delete_topic("orders.eu")):
            with pytest.raises(AccessDeniedError, match="is not an admin"):
                call()
    names = topic_names(acl_broker)
    assert "orders.admin" not in names and "orders.eu" in names
    with admin(acl_broker) as a:
        assert a.create_topic("orders.admin", 2) == 2
        assert a.broker_info()["transport"] == "tcp"


@pytest.mark.parametrize(("model", "topic", "group"), [
    pytest.param({}, "work", "gr", id="loop_pulls"),
    pytest.param({"pull_in_handler_threads": True}, "work-pulling", "gr-pulling", id="handler_threads_pull")])
def test_the_right_credentials_produce_consume_retry_and_dead_letter(acl_broker, model, topic, group):
    with Producer(acl_broker.address, access_key=APP[0], secret_key=APP[1]) as p:
        p.send_batch([Message(topic, f"{i}".encode(), tag="poison" if i % 5 == 0 else "ok") for i in range(20)])
    seen: dict[bytes, int] = {}
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen[m.body] = seen.get(m.body, 0) + 1
        if m.tag == "poison":
            raise ValueError("poison")

    c = Consumer(group, acl_broker.address, consume_from="first", max_reconsume_times=1, heartbeat_interval=0.5,
                 rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1,
                 access_key=APP[0], secret_key=APP[1], **model).subscribe(topic)
    c.start(handler)
    try:
        with admin(acl_broker) as a:
            assert wait_until(lambda: len(a.dlq_messages(group)) == 4, 60), seen
    finally:
        c.close()
    assert all(seen[f"{i}".encode()] == (2 if i % 5 == 0 else 1) for i in range(20)), seen
    with admin(acl_broker) as a:
        assert a.resend_dlq(group) == 4
        assert sum(hi for _, hi in a.queue_ranges(topic)) == 24


def test_denials_are_counted_in_stats_and_prometheus(acl_broker):
    with pytest.raises(AccessDeniedError):
        with Producer(acl_broker.address) as p:
            p.send_batch([Message("orders.eu", b"x")])
    with admin(acl_broker) as a:
        denied = a.stats()["access_denied"]
    assert denied >= 1
    text = urllib.request.urlopen(f"http://127.0.0.1:{acl_broker.metrics_port}/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("equeue_access_denied_total "))
    assert float(line.split()[1]) >= denied


def test_the_acl_file_reloads_without_a_restart_and_a_broken_one_keeps_the_last_good(acl_broker):
    path = acl_broker.acl_path
    late = ("late", "late-secret-0001")

    def late_can_send() -> bool:
        try:
            with Producer(acl_broker.address, access_key=late[0], secret_key=late[1]) as p:
                p.send_batch([Message("orders.late", b"hello")])
            return True
        except AccessDeniedError:
            return False

    assert not late_can_send()
    path.write_text(ACL + f'\n[[accounts]]\naccess_key = "{late[0]}"\nsecret_key = "{late[1]}"\n'
                          'topics = ["orders.late"]\n')
    assert wait_until(late_can_send, 30, 0.3)
    path.write_text("[[accounts]\nthis is not toml")
    assert wait_until(lambda: "ACL file not reloaded" in acl_broker.log_path.read_text(), 30, 0.1)
    assert late_can_send(), "a broken file must keep the last good accounts"
    assert acl_broker.log_path.read_text().count("ACL file not reloaded") == 1
    path.write_text(ACL)
    assert wait_until(lambda: not late_can_send(), 30, 0.3)


def test_cli_takes_access_key_and_secret_key(acl_broker):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "equeue_core.cli.main", "topics", "list", "--broker", acl_broker.address]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if not k.startswith("EQUEUE_")})
    assert refused.returncode == 1 and "access denied" in refused.stderr and "Traceback" not in refused.stderr
    ok = subprocess.run(cmd + ["--access-key", ADMIN[0], "--secret-key", ADMIN[1]], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "orders.eu" in ok.stdout
    via_env = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, EQUEUE_ACCESS_KEY=ADMIN[0], EQUEUE_SECRET_KEY=ADMIN[1]))
    assert via_env.returncode == 0 and "orders.eu" in via_env.stdout


def test_an_access_key_without_a_secret_is_a_config_error():
    with pytest.raises(ConfigError, match="go together"):
        BrokerConnection("tcp://127.0.0.1:1", access_key="app")


def test_lite_pull_consumer_signs_its_pulls_and_commits_and_a_wrong_secret_is_refused(acl_broker):
    from equeue_core.client import LitePullConsumer

    with Producer(acl_broker.address, access_key=ADMIN[0], secret_key=ADMIN[1]) as p:
        for key in ("k", "k2", "k3"):  # a backlog in more than one queue: a signed PULL_MULTI
            p.send_batch([Message("orders.lite", f"lite-{key}-{i}".encode()) for i in range(10)], routing_key=key)
    with LitePullConsumer("g1", acl_broker.address, access_key=APP[0], secret_key=APP[1],
                          consume_from="first") as c:
        c.assign("orders.lite")
        got: list = []
        deadline = time.monotonic() + 20
        while len(got) < 30 and time.monotonic() < deadline:
            got += c.poll(0.5)
        c.commit()  # a signed COMMIT_OFFSETS
        assert c.stats["multi_pulls"] >= 1
    assert sorted(m.body for m in got) == sorted(f"lite-{k}-{i}".encode() for k in ("k", "k2", "k3") for i in range(10))
    with LitePullConsumer("g1", acl_broker.address, access_key=APP[0], secret_key="not-the-secret") as c:
        with pytest.raises(AccessDeniedError):
            c.assign("orders.lite")


def test_a_lite_pull_refused_for_a_while_is_sent_again_by_the_next_poll_once_allowed(acl_broker):
    """The account loses its group right while its LitePullConsumer waits: the pull that goes out
    after the hold is refused and poll raises access_denied. Once the right is back, a later poll
    sends that queue's pull again and the next message arrives (a refused pull must not leave its
    queue without one for good)."""
    from equeue_core.client import LitePullConsumer

    path = acl_broker.acl_path
    rev = ("rev", "rev-secret-00001")
    allowed = ACL + "\n" + account(rev, topics=["orders.rev"], groups=["grev"])
    revoked = ACL + "\n" + account(rev, topics=["orders.rev"], groups=["someone-else"])

    def reload_to(text: str) -> None:
        seen = acl_broker.log_path.read_text().count("reloaded:")
        path.write_text(text)
        assert wait_until(lambda: acl_broker.log_path.read_text().count("reloaded:") > seen, 30, 0.05)

    reload_to(allowed)
    try:
        with admin(acl_broker) as a:
            a.create_topic("orders.rev", 1)
        with LitePullConsumer("grev", acl_broker.address, access_key=rev[0], secret_key=rev[1],
                              consume_from="last", hold_ms=300) as c:
            c.assign("orders.rev")
            assert c.poll(0.2) == []
            reload_to(revoked)
            refused = False
            deadline = time.monotonic() + 15
            while not refused and time.monotonic() < deadline:
                try:
                    c.poll(0.5)
                except AccessDeniedError:
                    refused = True
            assert refused
            reload_to(allowed)
            with Producer(acl_broker.address, access_key=ADMIN[0], secret_key=ADMIN[1]) as p:
                p.send(Message("orders.rev", b"after"))
            got: list = []
            deadline = time.monotonic() + 15
            while not got and time.monotonic() < deadline:
                got += c.poll(0.5)
            assert [m.body for m in got] == [b"after"]
    finally:
        reload_to(ACL)



def test_send_async_on_the_thread_lane_is_signed_and_a_refusal_fails_the_future(acl_broker):
    """Sparse send_async messages go on the Producer's lane connection (docs/client.md): each
    frame there is signed like the main path's, and one the ACL refuses (the account lost the
    topic after the producer had its route) fails its future with AccessDeniedError, with no
    retry: a refusal is not a transport failure."""
    path = acl_broker.acl_path
    lane_account = ("laner", "laner-secret-0001")
    path.write_text(ACL + f'\n[[accounts]]\naccess_key = "{lane_account[0]}"\nsecret_key = "{lane_account[1]}"\n'
                          'topics = ["orders.lane"]\n')
    try:
        with Producer(acl_broker.address, access_key=lane_account[0], secret_key=lane_account[1]) as p:
            def sent() -> bool:
                try:
                    return p.send_async(Message("orders.lane", b"probe")).result(30) is not None
                except AccessDeniedError:
                    return False

            assert wait_until(sent, 30, 0.3)
            results = [p.send_async(Message("orders.lane", f"lane-{i}".encode())).result(30) for i in range(30)]
            lane_frames = p.lane_frames
            assert lane_frames >= 25
            assert len({(r.queue_id, r.queue_offset) for r in results}) == 30
            path.write_text(ACL)  # the account goes; the producer keeps its route
            assert wait_until(lambda: not sent(), 30, 0.3)
            assert p.lane_frames > lane_frames  # the refusals came back on the lane
    finally:
        path.write_text(ACL)
