"""The console process over plain HTTP: a broker that goes away is a clear page, not a traceback,
and the console reconnects by itself when the broker is back. Form posts need their confirmation."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

import pytest

from equeue_core.client import AdminClient, Message, Producer
from tests.helpers.broker import BrokerProcess
from tests.helpers.console import ConsoleProcess


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url: str, fields: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(fields).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def broker_and_console(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    c = ConsoleProcess(b.address, tmp_path, sample_interval=0.5)
    try:
        c.start()
        yield b, c
    finally:
        c.stop()
        b.stop()


def test_a_broker_that_goes_away_is_a_clear_page_and_the_console_reconnects(broker_and_console):
    b, c = broker_and_console
    with Producer(b.address) as p:
        p.send(Message("orders", b"x"))
    status, body = get(c.url + "/topics")
    assert status == 200 and "orders" in body
    b.stop()
    status, body = get(c.url + "/topics")
    assert status == 503 and "is unreachable" in body and "Traceback" not in body
    b.start()  # same port and data
    status, body = get(c.url + "/topics")
    assert status == 200 and "orders" in body


def test_a_reset_post_without_its_confirmation_changes_nothing(broker_and_console):
    b, c = broker_and_console
    with Producer(b.address) as p:
        p.send_batch([Message("orders", b"x") for _ in range(10)])
    with AdminClient(b.address) as admin:
        admin.reset_offsets("g", "orders", "latest")
        status, body = post(c.url + "/groups/g/reset", {"topic": "orders", "to": "earliest"})
        assert status == 400 and "not confirmed" in body
        assert sum(r["lag"] for r in admin.groups("g")["g"]["queues"]) == 0


def test_bad_input_is_a_one_line_error_page(broker_and_console):
    _b, c = broker_and_console
    status, body = get(c.url + "/messages?id=not-an-id")
    assert status == 400 and "is not a message id" in body
    status, body = get(c.url + "/groups/g/reset?topic=orders&to=timestamp&ts=yesterday")
    assert status == 400 and "reset target" in body
    status, body = get(c.url + "/topics/no-such-topic")
    assert status == 400 and "no-such-topic" in body
