"""RouteRegistry rules, driven with a hand-moved clock (the registry is pure in-memory logic)."""

from __future__ import annotations

import pytest

from equeue_core import config
from equeue_core.errors import BrokerNameConflictError, ConfigError, ProtocolError, TopicNotFoundError
from equeue_core.nameserver.registry import RouteRegistry
from equeue_core.nameserver.routes import PERM_READ, PERM_READ_WRITE, TopicEntry, topics_from_wire

A = "tcp://127.0.0.1:10001"
B = "tcp://127.0.0.1:10002"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def registry(clock: Clock) -> RouteRegistry:
    return RouteRegistry(expiry_s=120, clock=clock)


def topics(**queues: int) -> dict[str, TopicEntry]:
    return {t: TopicEntry(n) for t, n in queues.items()}


def test_name_taken_by_a_live_broker_at_another_address_is_refused(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, connection_id=1)
    with pytest.raises(BrokerNameConflictError, match=r"broker name 'broker-a' in cluster 'c1' is taken by "
                                                      r"tcp://127.0.0.1:10001"):
        registry.register("c1", "broker-a", B, topics(orders=4), 1, connection_id=2)
    assert registry.brokers[("c1", "broker-a", 0)].address == A
    assert registry.stats.refused_conflicts == 1
    registry.register("c2", "broker-a", B, topics(), 1, connection_id=2)  # another cluster: its own names
    assert registry.cluster_info().clusters == {"c1": ["broker-a"], "c2": ["broker-a"]}


def test_name_is_free_again_once_its_holder_expired(registry, clock):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, connection_id=1)
    clock.now += 120
    registry.register("c1", "broker-a", B, topics(orders=2), 1, connection_id=2)
    assert registry.route("orders").brokers[0].address == B


def test_same_address_registering_again_is_the_same_broker_and_replaces_its_topics(registry, clock):
    registry.register("c1", "broker-a", A, topics(orders=4, audit=1), 1, connection_id=1)
    clock.now += 30
    registry.register("c1", "broker-a", A, topics(orders=8), 2, connection_id=7)  # restarted, new connection
    assert registry.route("orders").brokers[0].queues == 8
    with pytest.raises(TopicNotFoundError):
        registry.route("audit")
    assert registry.stats.joined == 1 and registry.stats.route_changes == 2
    registry.connection_lost(1)  # the old connection's close must not drop the live registration
    assert list(registry.brokers) == [("c1", "broker-a", 0)]
    registry.connection_lost(7)
    assert registry.brokers == {} and registry.stats.dropped_on_close == 1


def test_connection_close_drops_only_the_brokers_registered_on_it(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, connection_id=1)
    registry.register("c1", "broker-b", B, topics(orders=4), 1, connection_id=2)
    gone = registry.connection_lost(1)
    assert [e.name for e in gone] == ["broker-a"]
    assert [b.name for b in registry.route("orders").brokers] == ["broker-b"]


def test_silent_broker_is_hidden_at_once_and_removed_by_the_sweep(registry, clock):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, connection_id=1)
    registry.register("c1", "broker-b", B, topics(orders=4), 1, connection_id=2)
    clock.now += 100
    registry.register("c1", "broker-b", B, topics(orders=4), 1, connection_id=2)  # b heartbeats, a does not
    clock.now += 20
    assert [b.name for b in registry.cluster_info().brokers] == ["broker-b"]  # before any sweep
    assert [e.name for e in registry.expire()] == ["broker-a"]
    assert registry.stats.expired == 1 and list(registry.brokers) == [("c1", "broker-b", 0)]


def test_stale_unregister_never_removes_a_successor_at_another_address(registry, clock):
    registry.register("c1", "broker-a", A, topics(), 1, connection_id=1)
    clock.now += 200
    registry.register("c1", "broker-a", B, topics(), 1, connection_id=2)
    assert registry.unregister("c1", "broker-a", A) is False
    assert registry.unregister("c1", "broker-a", B) is True
    assert registry.brokers == {}


def test_route_lists_every_broker_with_its_queue_count_and_permission(registry):
    registry.register("c1", "broker-c", "tcp://h:3", {"orders": TopicEntry(2, PERM_READ)}, 1, 3)
    registry.register("c1", "broker-a", A, topics(orders=4), 1, 1)
    registry.register("c1", "broker-b", B, topics(other=1), 1, 2)
    route = registry.route("orders")
    assert [(b.name, b.queues, b.writable) for b in route.brokers] == [("broker-a", 4, True),
                                                                       ("broker-c", 2, False)]
    with pytest.raises(TopicNotFoundError, match="topic 'nowhere' has no route"):
        registry.route("nowhere")
    assert registry.stats.route_queries == 2 and registry.stats.route_misses == 1


@pytest.mark.parametrize("raw", [None, [], {"t": 4}, {"t": {"queues": 0}}, {"t": {"queues": "4"}},
                                 {"t": {"queues": 4, "perm": "rw"}}, {"t": {"queues": True}}])
def test_registration_with_malformed_topics_is_a_protocol_error(raw):
    with pytest.raises(ProtocolError):
        topics_from_wire(raw)


def test_topics_default_to_read_write():
    assert topics_from_wire({"t": {"queues": 3}}) == {"t": TopicEntry(3, PERM_READ_WRITE)}


@pytest.mark.parametrize("overrides, message", [
    ({"nameserver": "127.0.0.1:notaport"}, "name server address '127.0.0.1:notaport'"),
    ({"nameserver": " , "}, "names no address"),
    ({"broker_name": "a b"}, "config broker_name 'a b'"),
    ({"cluster": ""}, "config cluster ''"),
    ({"register_interval_s": 0}, "register_interval_s"),
    ({"broker_expiry_s": -1}, "broker_expiry_s"),
])
def test_bad_cluster_config_is_a_one_line_error(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        config.load(overrides=overrides, environ={})
    assert "\n" not in str(e.value)


# ------------------------------------------------------------ broker groups (issue 11)

def test_members_of_a_group_share_a_name_with_distinct_broker_ids_and_the_route_names_master_and_replicas(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, 1, broker_id=0, role="replica", epoch=2)
    registry.register("c1", "broker-a", B, topics(orders=4), 1, 2, broker_id=1, role="master", epoch=2)
    (r,) = registry.route("orders").brokers
    assert (r.name, r.address, r.replicas, r.is_master, r.writable) == ("broker-a", B, (A,), True, True)
    assert registry.cluster_info().clusters == {"c1": ["broker-a"]}
    assert [(b.broker_id, b.role) for b in registry.cluster_info().brokers] == [(0, "replica"), (1, "master")]


def test_same_name_and_broker_id_at_another_live_address_is_still_a_conflict(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, 1, broker_id=1)
    with pytest.raises(BrokerNameConflictError, match=r"another --broker-id than 1"):
        registry.register("c1", "broker-a", B, topics(orders=4), 1, 2, broker_id=1)


def test_a_group_without_a_live_master_is_routed_read_only_to_a_replica(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, 1, broker_id=0, role="master", epoch=1)
    registry.register("c1", "broker-a", B, topics(orders=4), 1, 2, broker_id=1, role="replica", epoch=1)
    registry.connection_lost(1)  # the master died
    (r,) = registry.route("orders").brokers
    assert (r.address, r.is_master, r.readable, r.writable, r.replicas) == (B, False, True, False, ())


def test_the_controllers_choice_of_master_wins_over_what_the_brokers_registered(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, 1, broker_id=0, role="master", epoch=1)
    registry.register("c1", "broker-a", B, topics(orders=4), 1, 2, broker_id=1, role="replica", epoch=1)
    registry.master_of = lambda cluster, name: 1  # elected at epoch 2; broker 0 has not heard yet
    (r,) = registry.route("orders").brokers
    assert (r.address, r.replicas) == (B, (A,))


def test_a_live_master_is_the_front_even_for_a_topic_only_a_replica_registered_so_far(registry):
    registry.register("c1", "broker-a", A, topics(orders=4), 1, 1, broker_id=0, role="master", epoch=2)
    registry.register("c1", "broker-a", B, topics(orders=4, **{"%RETRY%g": 1}), 1, 2, broker_id=1,
                      role="replica", epoch=2)  # synced the new topic before the master re-registered
    (r,) = registry.route("%RETRY%g").brokers
    assert (r.address, r.is_master, r.writable, r.replicas) == (A, True, True, (B,))
