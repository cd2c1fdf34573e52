"""The name server's Prometheus endpoint (`nameserver_metrics_port`, default 9878; 0 = off).

Like the broker's (equeue_core/broker/prometheus.py, whose endpoint it reuses), nothing is kept
for Prometheus between scrapes: each scrape takes one snapshot of the route registry on the name
server's event loop -- its counters (RegistryStats, which only grow) and the live brokers -- and
renders it. Every name is described in docs/operations.md, "Name server metrics".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

# RegistryStats field -> (metric name without _total, help)
COUNTERS = {
    "registrations": ("equeue_nameserver_registrations", "REGISTER_BROKER requests accepted (first ones and refreshes)."),
    "joined": ("equeue_nameserver_brokers_joined", "Registrations that added a broker not listed before."),
    "route_changes": ("equeue_nameserver_route_changes", "Registrations that changed a broker's topics."),
    "refused_conflicts": ("equeue_nameserver_refused_conflicts",
                          "Registrations refused: the name is held in the cluster by another address."),
    "unregistered": ("equeue_nameserver_brokers_unregistered", "Brokers removed by UNREGISTER_BROKER (clean stops)."),
    "dropped_on_close": ("equeue_nameserver_brokers_dropped_on_close",
                         "Brokers removed because their registering connection closed."),
    "expired": ("equeue_nameserver_brokers_expired", "Brokers removed after broker_expiry_s of silence."),
    "route_queries": ("equeue_nameserver_route_queries", "GET_ROUTE requests answered."),
    "route_misses": ("equeue_nameserver_route_misses", "GET_ROUTE requests for a topic no live broker has."),
    "cluster_queries": ("equeue_nameserver_cluster_queries", "GET_CLUSTER_INFO requests answered."),
}


def families(snap: dict[str, Any]) -> Iterator[Metric]:
    info = GaugeMetricFamily("equeue_nameserver_info", "Name server identity; the value is always 1.",
                             labels=["address", "transport"])
    info.add_metric([snap["address"], snap["transport"]], 1)
    yield info
    brokers = GaugeMetricFamily("equeue_nameserver_brokers", "Live brokers registered, per cluster.",
                                labels=["cluster"])
    for cluster, count in sorted(snap["clusters"].items()):
        brokers.add_metric([cluster], count)
    yield brokers
    age = GaugeMetricFamily("equeue_nameserver_broker_heartbeat_age_seconds",
                            "Seconds since each live broker last registered.", labels=["cluster", "broker"])
    topics = GaugeMetricFamily("equeue_nameserver_broker_topics", "Topics each live broker registered.",
                               labels=["cluster", "broker"])
    seen: set[tuple[str, str]] = set()
    for b in snap["brokers"]:  # one sample per group (its lowest broker id): the labels name no broker id
        if (b["cluster"], b["name"]) in seen:
            continue
        seen.add((b["cluster"], b["name"]))
        age.add_metric([b["cluster"], b["name"]], b["heartbeat_age_s"])
        topics.add_metric([b["cluster"], b["name"]], b["topics"])
    yield age
    yield topics
    for key, (name, doc) in COUNTERS.items():
        yield CounterMetricFamily(name, doc, value=snap["stats"][key])
    ctl = snap.get("controller")
    if ctl is not None:  # the name server runs the controller (docs/controller.md)
        yield GaugeMetricFamily("equeue_controller_leader", "1 while this name server's controller is the Raft leader.",
                                value=1 if ctl["leader"] else 0)
        yield CounterMetricFamily("equeue_controller_elections", "Masters elected by this name server as Raft leader.",
                                  value=ctl["elections"])
        epoch = GaugeMetricFamily("equeue_controller_group_epoch", "Each broker group's committed epoch.",
                                  labels=["cluster", "group"])
        has_master = GaugeMetricFamily("equeue_controller_group_has_master",
                                       "1 while the broker group has a master, 0 while it is read-only.",
                                       labels=["cluster", "group"])
        in_sync = GaugeMetricFamily("equeue_controller_group_in_sync_replicas",
                                    "Replicas in the group's in-sync set as its master last reported.",
                                    labels=["cluster", "group"])
        for g in ctl["groups"]:
            epoch.add_metric([g["cluster"], g["name"]], g["epoch"])
            has_master.add_metric([g["cluster"], g["name"]], 1 if g["has_master"] else 0)
            in_sync.add_metric([g["cluster"], g["name"]], g["in_sync"])
        yield epoch
        yield has_master
        yield in_sync
