"""The web console in a real browser (headless Chromium from Debian) against a real broker and a
real `equeue console` process. Each test saves a screenshot of its page (tmp dir, and
$EQUEUE_ARTIFACTS when set)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from equeue_core.client import AdminClient, Consumer, Message, Producer
from tests.helpers.broker import BrokerProcess
from tests.helpers.console import ConsoleProcess, chromium_session, save_screenshot, wait
from tests.helpers.consume import Collector


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def web_broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("broker") / "data") as b:
        yield b


@pytest.fixture(scope="module")
def console(web_broker, tmp_path_factory):
    c = ConsoleProcess(web_broker.address, tmp_path_factory.mktemp("console"), sample_interval=1.0).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def browser():
    with chromium_session() as driver:
        yield driver


def test_topics_page_lists_a_topic_just_created(web_broker, console, browser, shots):
    with AdminClient(web_broker.address) as admin:
        admin.create_topic("fresh-orders", 3)
    browser.get(console.url + "/topics")
    row = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-topic="fresh-orders"]')))
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "fresh-orders" and cells[1] == "3"
    save_screenshot(browser, shots, "console-topics")
    row.find_element(By.LINK_TEXT, "fresh-orders").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "queues")))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")) == 3
    browser.get(console.url + "/")
    assert web_broker.address.split("://")[1] in browser.find_element(By.ID, "brokers").text
    save_screenshot(browser, shots, "console-overview")


def _total_lag(browser) -> int:
    return int(browser.find_element(By.ID, "total-lag").text)


def test_group_page_shows_lag_falling_as_a_consumer_runs(web_broker, console, browser, shots):
    n = 3000
    with Producer(web_broker.address) as p:
        for i in range(0, n, 500):
            p.send_batch([Message("work", f"job {j}".encode()) for j in range(i, i + 500)])
    with AdminClient(web_broker.address) as admin:
        admin.reset_offsets("workers", "work", "earliest")  # the group exists, nothing consumed: lag = n
    browser.get(console.url + "/groups/workers")
    wait(browser).until(lambda d: _total_lag(d) == n)
    seen = Collector(n)

    def slow(m) -> None:
        time.sleep(0.003)  # slow enough that the lag visibly falls over several samples
        seen(m)

    consumer = Consumer("workers", web_broker.address, consume_from="first", threads=1, commit_interval=0.5)
    consumer.subscribe("work")
    consumer.start(slow)
    try:
        wait(browser, 120).until(lambda d: 0 < _total_lag(d) < n * 0.8)  # updated live by the page's poll
        falling = _total_lag(browser)
        wait(browser, 120).until(lambda d: _total_lag(d) < falling)
        assert browser.find_elements(By.CSS_SELECTOR, "#lag-chart .uplot canvas"), "no lag chart drawn"
        owners = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#group-queues td.owner")]
        assert consumer.client_id in owners
        assert consumer.client_id in browser.find_element(By.ID, "members").text
        time.sleep(2.5)  # one more poll, so the screenshot's chart shows the fall
        save_screenshot(browser, shots, "console-group-lag")
    finally:
        consumer.close()


def test_message_found_by_key_shows_its_body(web_broker, console, browser, shots):
    body = {"order": 42, "item": "a book", "lines": [1, 2, 3]}
    with Producer(web_broker.address) as p:
        sent = p.send(Message("orders", json.dumps(body).encode(), tag="created", keys=["order-42"]))
    browser.get(console.url + "/messages")
    form = browser.find_element(By.ID, "by-key")
    form.find_element(By.NAME, "topic").send_keys("orders")
    form.find_element(By.NAME, "key").send_keys("order-42")
    form.find_element(By.TAG_NAME, "button").click()
    article = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "article.message")))
    assert article.get_attribute("data-msg-id") == sent.msg_id
    shown = article.find_element(By.CSS_SELECTOR, 'pre.body[data-view="json"]')
    assert shown.is_displayed() and '"item": "a book"' in shown.text  # pretty JSON by default
    save_screenshot(browser, shots, "console-message-by-key")
    article.find_element(By.CSS_SELECTOR, 'button[data-view="hex"]').click()
    hexed = article.find_element(By.CSS_SELECTOR, 'pre.body[data-view="hex"]')
    assert hexed.is_displayed() and hexed.text.startswith("00000000  7b 22")
    browser.get(console.url + "/messages?id=" + sent.msg_id)
    assert "order-42" in browser.find_element(By.CSS_SELECTOR, "article.message").text


def test_dlq_message_resent_from_the_page_reaches_its_consumer(web_broker, console, browser, shots):
    failing = threading.Event()
    failing.set()
    got = Collector(1)

    def handler(m) -> None:
        if m.body == b"poison" and failing.is_set():
            raise ValueError("cannot handle poison yet")
        if m.body == b"poison":
            got(m)

    with Producer(web_broker.address) as p:
        p.send_batch([Message("pay", b"fine"), Message("pay", b"poison", keys=["p-1"])])
    consumer = Consumer("payers", web_broker.address, consume_from="first", max_reconsume_times=0,
                        commit_interval=0.5)
    consumer.subscribe("pay")
    consumer.start(handler)
    try:
        with AdminClient(web_broker.address) as admin:
            deadline = time.monotonic() + 60
            while not admin.dlq_messages("payers") and time.monotonic() < deadline:
                time.sleep(0.2)
            dead = admin.dlq_messages("payers")
        assert [m.body for m in dead] == [b"poison"]
        failing.clear()  # the bug is fixed: the next delivery succeeds
        browser.get(console.url + "/groups/payers/dlq")
        box = wait(browser).until(EC.presence_of_element_located(
            (By.CSS_SELECTOR, f'input[name="msg_id"][value="{dead[0].msg_id}"]')))
        box.click()
        save_screenshot(browser, shots, "console-dlq")
        browser.find_element(By.ID, "resend").click()
        notice = wait(browser).until(EC.presence_of_element_located((By.ID, "notice")))
        assert "re-sent 1 messages" in notice.text
        assert got.wait(60), "the re-sent message never reached the consumer"
        assert got.messages[0].topic == "pay"
        save_screenshot(browser, shots, "console-dlq-resent")
    finally:
        consumer.close()


def test_reset_to_earliest_asks_for_confirmation_then_moves_the_offsets(web_broker, console, browser, shots):
    with Producer(web_broker.address) as p:
        p.send_batch([Message("audit", f"a{i}".encode()) for i in range(40)])
    with AdminClient(web_broker.address) as admin:
        admin.reset_offsets("auditors", "audit", "latest")
    browser.get(console.url + "/groups/auditors")
    wait(browser).until(lambda d: _total_lag(d) == 0)
    form = browser.find_element(By.ID, "reset-form")
    form.find_element(By.CSS_SELECTOR, 'input[value="earliest"]').click()
    form.find_element(By.TAG_NAME, "button").click()
    confirm = wait(browser).until(EC.presence_of_element_located((By.ID, "confirm-reset")))
    assert browser.find_element(By.ID, "reset-target").text == "earliest"
    with AdminClient(web_broker.address) as admin:  # nothing moved before the confirmation
        assert sum(r["lag"] for r in admin.groups("auditors")["auditors"]["queues"]) == 0
    save_screenshot(browser, shots, "console-reset-confirm")
    confirm.click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "notice")))
    wait(browser).until(lambda d: _total_lag(d) == 40)
    with AdminClient(web_broker.address) as admin:
        assert sum(r["lag"] for r in admin.groups("auditors")["auditors"]["queues"]) == 40
