"""The name server: a stateless route registry brokers register with (docs/cluster.md)."""

from equeue_core.nameserver.registry import RegistryStats, RouteRegistry
from equeue_core.nameserver.routes import BrokerRoute, BrokerSummary, ClusterInfo, TopicEntry, TopicRoute

__all__ = ["BrokerRoute", "BrokerSummary", "ClusterInfo", "RegistryStats", "RouteRegistry", "TopicEntry",
           "TopicRoute"]
