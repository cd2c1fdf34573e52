"""The web console and `equeue stats` over a real cluster: 1 name server + 2 broker processes, a
real `equeue console --nameserver` process driven by headless Chromium (Debian's), and the stats
CLI off a terminal. Screenshots are saved like tests/test_console_browser.py's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.nameserver import NameServerClient
from equeue_core.errors import TopicNotFoundError
from tests.helpers.broker import BrokerProcess
from tests.helpers.console import ConsoleProcess, chromium_session, save_screenshot, wait
from tests.helpers.nameserver import NameServerProcess, cluster_args, wait_for

NAMES = ("broker-a", "broker-b")


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    """(name server address, {broker name: BrokerProcess}) of a running 1 + 2 cluster."""
    root = tmp_path_factory.mktemp("cluster")
    with contextlib.ExitStack() as stack:
        ns = NameServerProcess(root).start()
        stack.callback(ns.stop)
        brokers = {}
        for name in NAMES:
            b = BrokerProcess(root / name, extra_args=cluster_args([ns], name)).start()
            stack.callback(b.stop)
            brokers[name] = b
        with AdminClient(nameserver=ns.address) as admin:
            wait_for(lambda: {b.name for b in admin.brokers()} == set(NAMES), 30, what="both brokers registered")
        yield ns.address, brokers


def _has_route(ns: NameServerClient, topic: str) -> bool:
    try:
        return bool(ns.get_route(topic))
    except TopicNotFoundError:
        return False


@pytest.fixture(scope="module")
def cluster_console(two_brokers, tmp_path_factory):
    nameserver, _ = two_brokers
    c = ConsoleProcess(None, tmp_path_factory.mktemp("console"), sample_interval=1.0, nameserver=nameserver).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def browser():
    with chromium_session() as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def _cells(row) -> list[str]:
    return [c.text for c in row.find_elements(By.TAG_NAME, "td")]


def test_overview_lists_every_broker_of_the_cluster(two_brokers, cluster_console, browser, shots):
    _, brokers = two_brokers
    browser.get(cluster_console.url + "/")
    for name, b in brokers.items():
        row = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-broker="{name}"]')))
        cells = _cells(row)
        assert cells[:4] == ["c1", name, b.address, "master"], cells

    def rated():  # in/out msg/s appear once the console has two samples of each broker
        browser.get(cluster_console.url + "/")
        rows = browser.find_elements(By.CSS_SELECTOR, "#brokers tbody tr[data-broker]")
        return len(rows) == 2 and all(_cells(r)[6] != "-" and _cells(r)[7] != "-" for r in rows)

    wait_for(rated, 60, interval=0.5, what="rates per broker on the overview")
    save_screenshot(browser, shots, "console-cluster-overview")


def test_topics_page_shows_a_topic_of_both_brokers_with_a_broker_column(two_brokers, cluster_console, browser, shots):
    nameserver, _ = two_brokers
    with AdminClient(nameserver=nameserver) as admin:
        assert admin.create_topic("cluster-orders", 3) == {n: 3 for n in NAMES}
    browser.get(cluster_console.url + "/topics")
    rows = wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-topic="cluster-orders"]')
                               if len(d.find_elements(By.CSS_SELECTOR, 'tr[data-topic="cluster-orders"]')) == 2
                               else None)
    assert browser.find_element(By.CSS_SELECTOR, "#topics thead th").text == "broker"
    assert sorted(_cells(r)[:3] for r in rows) == [[n, "cluster-orders", "3"] for n in NAMES]
    save_screenshot(browser, shots, "console-cluster-topics")
    browser.get(cluster_console.url + "/topics/cluster-orders")
    queues = wait(browser).until(EC.presence_of_element_located((By.ID, "queues")))
    assert sorted(_cells(r)[0] for r in queues.find_elements(By.CSS_SELECTOR, "tbody tr")) == sorted(NAMES * 3)


def _lag(browser, broker: str, queue: str) -> int:
    return int(browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{broker}:{queue}"] td.lag').text)


def _total_lag(browser) -> int:
    return int(browser.find_element(By.ID, "total-lag").text)


def test_group_page_shows_lag_per_broker_and_queue_falling_as_a_cluster_consumer_runs(
        two_brokers, cluster_console, browser, shots):
    nameserver, brokers = two_brokers
    per_broker = 1500
    with AdminClient(nameserver=nameserver) as admin:
        admin.create_topic("cluster-work", 2)
        for name, b in brokers.items():  # the same number on each broker, sent to it directly
            with Producer(b.address) as p:
                for i in range(0, per_broker, 500):
                    p.send_batch([Message("cluster-work", f"{name} {j}".encode()) for j in range(i, i + 500)])
        admin.reset_offsets("cluster-workers", "cluster-work", "earliest")  # the group exists on both: lag = all
    n = per_broker * len(NAMES)
    browser.get(cluster_console.url + "/groups/cluster-workers")
    wait(browser).until(lambda d: _total_lag(d) == n)
    start = {(name, q): _lag(browser, name, f"cluster-work/{q}") for name in NAMES for q in (0, 1)}
    assert sum(start.values()) == n and all(v > 0 for v in start.values()), start
    save_screenshot(browser, shots, "console-cluster-group-before")

    def slow(_m) -> None:
        time.sleep(0.003)  # slow enough that the lag visibly falls over several polls

    consumer = Consumer("cluster-workers", nameserver=nameserver, consume_from="first", threads=1,
                        commit_interval=0.5, route_refresh_s=1.0, rebalance_interval=1.0)
    consumer.subscribe("cluster-work").start(slow)
    try:
        # updated live by the page's poll: every broker's queues fall, not only the total
        wait(browser, 180).until(lambda d: all(_lag(d, b, f"cluster-work/{q}") < start[(b, q)]
                                               for b in NAMES for q in (0, 1)))
        assert 0 <= _total_lag(browser) < n
        assert browser.find_elements(By.CSS_SELECTOR, "#lag-chart .uplot canvas"), "no lag chart drawn"
        owners = browser.find_element(By.ID, "group-queues").text
        assert all(name in owners for name in NAMES)
        time.sleep(2.5)  # one more poll, so the screenshot's chart shows the fall
        save_screenshot(browser, shots, "console-cluster-group-lag")
    finally:
        consumer.close()


def test_stats_once_with_a_nameserver_prints_a_row_per_broker(two_brokers):
    nameserver, brokers = two_brokers
    with AdminClient(nameserver=nameserver) as admin:
        admin.create_topic("cluster-stats", 2)
    for b in brokers.values():
        with Producer(b.address) as p:
            p.send_batch([Message("cluster-stats", b"x") for _ in range(50)])
    r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "stats", "--nameserver", nameserver,
                        "--interval", "0.2", "--once"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert r.returncode == 0, r.stderr
    for name, b in brokers.items():
        row = next((line for line in r.stdout.splitlines() if line.split()[:2] == [name, b.address.split("://")[-1]]), None)
        assert row is not None, r.stdout
        assert f"── broker {name} ──" in r.stdout
    assert r.stdout.count("cluster-stats") == len(NAMES), r.stdout  # each broker's own topics table


def _broker_lag(nameserver: str, group: str) -> dict[str, int]:
    with AdminClient(nameserver=nameserver) as admin:
        return {b: sum(r["lag"] for r in answer[group]["queues"]) for b, answer in admin.groups(group).items()}


def test_reset_on_all_brokers_lists_each_broker_before_moving_both(two_brokers, cluster_console, browser, shots):
    nameserver, brokers = two_brokers
    with AdminClient(nameserver=nameserver) as admin:
        admin.create_topic("cluster-audit", 2)
        for name, b in brokers.items():
            with Producer(b.address) as p:
                p.send_batch([Message("cluster-audit", f"{name}-{i}".encode()) for i in range(20)])
        admin.reset_offsets("cluster-auditors", "cluster-audit", "latest")
    browser.get(cluster_console.url + "/groups/cluster-auditors")
    wait(browser).until(lambda d: _total_lag(d) == 0)
    form = browser.find_element(By.ID, "reset-form")
    form.find_element(By.CSS_SELECTOR, 'input[value="earliest"]').click()
    form.find_element(By.TAG_NAME, "button").click()  # broker: "all brokers" is the default
    confirm = wait(browser).until(EC.presence_of_element_located((By.ID, "confirm-reset")))
    assert browser.find_element(By.ID, "reset-brokers").text == "each of 2 brokers: broker-a, broker-b"
    listed = sorted(_cells(r)[:2] for r in browser.find_elements(By.CSS_SELECTOR, "table tbody tr"))
    assert listed == [[n, str(q)] for n in NAMES for q in (0, 1)]
    assert _broker_lag(nameserver, "cluster-auditors") == {n: 0 for n in NAMES}  # nothing moved yet
    save_screenshot(browser, shots, "console-cluster-reset-confirm")
    confirm.click()
    notice = wait(browser).until(EC.presence_of_element_located((By.ID, "notice")))
    assert "broker-a:cluster-audit/0" in notice.text and "broker-b:cluster-audit/1" in notice.text
    assert _broker_lag(nameserver, "cluster-auditors") == {n: 20 for n in NAMES}


def test_reset_on_one_chosen_broker_leaves_the_other_alone(two_brokers, cluster_console, browser):
    nameserver, brokers = two_brokers
    with AdminClient(nameserver=nameserver) as admin:
        admin.create_topic("cluster-ledger", 1)
        for b in brokers.values():
            with Producer(b.address) as p:
                p.send_batch([Message("cluster-ledger", b"x") for _ in range(7)])
        admin.reset_offsets("cluster-ledgers", "cluster-ledger", "latest")
    browser.get(cluster_console.url + "/groups/cluster-ledgers")
    form = wait(browser).until(EC.presence_of_element_located((By.ID, "reset-form")))
    form.find_element(By.CSS_SELECTOR, 'select[name="broker"] option[value=""]')  # "all brokers" is offered
    for option in form.find_elements(By.CSS_SELECTOR, 'select[name="broker"] option'):
        if option.text == "broker-b":
            option.click()
    form.find_element(By.CSS_SELECTOR, 'input[value="earliest"]').click()
    form.find_element(By.TAG_NAME, "button").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "confirm-reset"))).click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "notice")))
    assert _broker_lag(nameserver, "cluster-ledgers") == {"broker-a": 0, "broker-b": 7}


def test_message_by_id_comes_from_its_broker_and_by_key_from_both(two_brokers, cluster_console, browser, shots):
    _, brokers = two_brokers
    sent = {}
    for name, b in brokers.items():
        with Producer(b.address) as p:
            sent[name] = p.send(Message("cluster-mail", f"letter from {name}".encode(), keys=["k-77"]))
    browser.get(cluster_console.url + "/messages?id=" + sent["broker-b"].msg_id)
    article = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "article.message")))
    assert article.get_attribute("data-msg-id") == sent["broker-b"].msg_id
    assert "letter from broker-b" in article.text

    def both_found():  # reloaded: the name servers learn a broker's new topic at its next registration
        browser.get(cluster_console.url + "/messages?topic=cluster-mail&key=k-77")
        found = browser.find_elements(By.CSS_SELECTOR, "article.message")
        return found if len(found) == 2 else None

    found = wait_for(both_found, 60, interval=0.5, what="the key found on both brokers")
    assert sorted(a.get_attribute("data-msg-id") for a in found) == sorted(m.msg_id for m in sent.values())
    save_screenshot(browser, shots, "console-cluster-message-by-key")


def test_dlq_of_one_broker_is_resent_from_the_page_by_that_broker(two_brokers, cluster_console, browser, shots):
    nameserver, brokers = two_brokers
    failing = threading.Event()
    failing.set()
    got = threading.Event()

    def handler(m) -> None:
        if m.body == b"poison" and failing.is_set():
            raise ValueError("cannot handle poison yet")
        if m.body == b"poison":
            got.set()

    with Producer(brokers["broker-b"].address) as p:
        p.send_batch([Message("cluster-pay", b"fine"), Message("cluster-pay", b"poison")])
    # the topic was made on broker-b directly: the name server hears of it at broker-b's next
    # registration, and a consumer started before that has no route to subscribe to
    with NameServerClient(nameserver) as ns:
        wait_for(lambda: _has_route(ns, "cluster-pay"), 60, interval=0.2, what="a route for cluster-pay")
    consumer = Consumer("cluster-payers", nameserver=nameserver, consume_from="first", max_reconsume_times=0,
                        commit_interval=0.5, route_refresh_s=1.0, rebalance_interval=1.0)
    consumer.subscribe("cluster-pay").start(handler)
    try:
        with AdminClient(brokers["broker-b"].address) as admin:
            dead = wait_for(lambda: admin.dlq_messages("cluster-payers"), 90, interval=0.2, what="a dead letter")
        assert [m.body for m in dead] == [b"poison"]
        failing.clear()
        browser.get(cluster_console.url + "/groups/cluster-payers/dlq")
        box = wait(browser).until(EC.presence_of_element_located(
            (By.CSS_SELECTOR, f'input[name="msg_id"][value="broker-b {dead[0].msg_id}"]')))
        assert _cells(box.find_element(By.XPATH, "./../.."))[1] == "broker-b"  # the broker column
        box.click()
        save_screenshot(browser, shots, "console-cluster-dlq")
        browser.find_element(By.ID, "resend").click()
        notice = wait(browser).until(EC.presence_of_element_located((By.ID, "notice")))
        assert "re-sent 1 messages" in notice.text
        assert got.wait(90), "the re-sent message never reached the consumer"
    finally:
        consumer.close()
