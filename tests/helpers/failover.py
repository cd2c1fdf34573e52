"""A broker group under the controller, for the failover tests and bench/bench_failover.py: three
controller name servers, N broker processes in controller mode with replication, producers
sending continuously, and one kill -9 of the master at a time.

Every process is real and on 127.0.0.1; `close()` stops them all.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from equeue_core import msgid
from equeue_core.client import AdminClient, Producer
from equeue_core.client.message import Message
from equeue_core.client.nameserver import NameServerClient
from equeue_core.errors import EQueueError
from tests.helpers.broker import BrokerProcess
from tests.helpers.controller import group_view, wait_for_master
from tests.helpers.nameserver import NameServerProcess, cluster_args, controller_nameservers
from tests.helpers.waiting import wait_until


class Senders:
    """`count` threads, each with its own Producer over the name servers, sending numbered bodies
    one at a time; `acked` holds every body a send acknowledged, `ack_times` when and by which
    broker port (from the message id: the broker that stored it)."""

    def __init__(self, nameserver: str, topic: str, count: int = 2) -> None:
        self.nameserver, self.topic = nameserver, topic
        self.acked: set[bytes] = set()
        self.ack_times: list[tuple[float, int]] = []
        self.failures = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def start(self) -> Senders:
        for t in self.threads:
            t.start()
        return self

    def _run(self, index: int) -> None:
        seq = 0
        with Producer(nameserver=self.nameserver, send_timeout=3.0, linger_ms=0) as producer:
            while not self.stopping.is_set():
                body = f"s{index}-{seq}".encode()
                seq += 1
                try:
                    result = producer.send(Message(self.topic, body))
                except EQueueError:
                    with self.lock:
                        self.failures += 1
                    time.sleep(0.05)
                    continue
                with self.lock:
                    self.acked.add(body)
                    self.ack_times.append((time.monotonic(), msgid.decode(result.msg_id)[1]))

    def acks_after(self, t: float) -> int:
        with self.lock:
            return sum(1 for x, _ in self.ack_times if x > t)

    def first_ack_after(self, t: float, port: int) -> float | None:
        """When the first send after `t` was acknowledged by the broker on `port` (None: none yet)."""
        with self.lock:
            later = [x for x, p in self.ack_times if x > t and p == port]
        return min(later) if later else None

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)


@dataclass
class ControlledGroup:
    tmp: Path
    members: int = 3
    replication: str = "sync"
    name: str = "broker-a"
    nameservers: list[NameServerProcess] = field(default_factory=list)
    brokers: list[BrokerProcess] = field(default_factory=list)

    def start(self) -> ControlledGroup:
        self.nameservers = controller_nameservers(self.tmp)
        for n in self.nameservers:
            n.start()
        self.brokers = [BrokerProcess(self.tmp / f"b{i}", extra_args=[
            *cluster_args(self.nameservers, self.name), "--broker-id", str(i), "--controller",
            "--replication", self.replication]) for i in range(self.members)]
        for b in self.brokers:
            b.start()
        self.client = NameServerClient(self.nameserver)
        return self

    @property
    def nameserver(self) -> str:
        return ",".join(n.address for n in self.nameservers)

    def view(self) -> dict[str, Any] | None:
        return group_view(self.client, self.name)

    def wait_master(self, timeout: float, epoch_above: int = 0) -> dict[str, Any]:
        return wait_for_master(self.client, self.name, timeout, epoch_above)

    def wait_in_sync(self, broker_ids: set[int], timeout: float) -> dict[str, Any]:
        """Wait until the controller's in-sync set holds `broker_ids` (all of them)."""
        seen: dict[str, Any] = {}

        def probe() -> bool:
            g = self.view()
            seen["g"] = g
            return g is not None and g["master_id"] is not None and broker_ids <= set(g["in_sync"])

        assert wait_until(probe, timeout, 0.2), f"in-sync set never held {broker_ids}: {seen}"
        return seen["g"]

    def create_topic(self, topic: str, queues: int = 4) -> None:
        with AdminClient(nameserver=self.nameserver) as admin:
            admin.create_topic(topic, queues)

    def close(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        for b in self.brokers:
            b.kill()
        for n in self.nameservers:
            n.kill()


def kill_master_once(group: ControlledGroup, senders: Senders, election_bound_s: float = 10.0) -> dict[str, Any]:
    """One failover: wait until the producers are acknowledged, kill -9 the master, wait (bounded)
    for a new master at the next epoch and for sends acknowledged by it. Returns what happened:
    old and new master ids, epochs, `elected_s` (kill to committed election) and `first_send_s`
    (kill to the first send the new master acknowledged)."""
    g = group.view()
    assert g is not None and g["master_id"] is not None and g["in_sync"], g
    old = group.brokers[g["master_id"]]
    base = senders.acks_after(0)
    assert wait_until(lambda: senders.acks_after(0) >= base + 50, 30), ("producers stalled", senders.failures)
    killed = time.monotonic()
    old.kill()
    g2 = group.wait_master(election_bound_s, epoch_above=g["epoch"])
    elected_s = time.monotonic() - killed
    new_port = group.brokers[g2["master_id"]].port
    assert wait_until(lambda: senders.first_ack_after(killed, new_port) is not None, 30), \
        "producers did not resume on the new master"
    first = senders.first_ack_after(killed, new_port)
    assert first is not None
    return {"old_master": g["master_id"], "new_master": g2["master_id"], "in_sync_before": g["in_sync"],
            "epoch_before": g["epoch"], "epoch": g2["epoch"], "elected_s": round(elected_s, 3),
            "first_send_s": round(first - killed, 3)}
