"""NameServer: serves a RouteRegistry over the configured transport (RocketMQ's NamesrvController).

Stateless: nothing is read from or written to disk; all it knows comes from broker registrations,
so any number can run side by side and a restarted one learns every route back from the brokers'
next registrations (within `register_interval_s`). It speaks the broker's frame format over the
same transport plugins; the codes are 40-44 (docs/protocol.md). Brokers are dropped at once when
the connection they registered on closes (RocketMQ's BrokerHousekeepingService) and after
`broker_expiry_s` of silence (a sweep every `sweep_interval(expiry)` seconds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from equeue_core.codes import Code
from equeue_core.config import Config
from equeue_core.contracts import ServerConnection
from equeue_core.dispatch import Handler, dispatch, header_int, header_str
from equeue_core.errors import ConfigError, NoControllerError, ProtocolError
from equeue_core.frame import Frame
from equeue_core.nameserver.registry import RouteRegistry
from equeue_core.nameserver.routes import check_broker_name, topics_from_wire
from equeue_core.plugins import PluginManager, get_plugin_manager
from equeue_core.serving import access_gate, server_settings

if TYPE_CHECKING:
    from equeue_core.broker.access_gate import AccessGate

log = logging.getLogger("equeue.nameserver")


def optional_int(header: dict, key: str, default: int = 0) -> int:
    """An optional non-negative integer header field (absent: `default`; ProtocolError if malformed)."""
    if key not in header:
        return default
    v = header_int(header, key)
    if v < 0:
        raise ProtocolError(f"header field {key!r} must not be negative")
    return v


def sweep_interval(expiry_s: float) -> float:
    """How often silent brokers are looked for: RocketMQ's 10 s, or a fifth of a shorter expiry."""
    return max(0.05, min(10.0, expiry_s / 5))


class NameServer:
    def __init__(self, config: Config, plugins: PluginManager | None = None) -> None:
        self.config = config
        self.plugins = plugins or get_plugin_manager()
        self.registry = RouteRegistry(expiry_s=config.broker_expiry_s)
        self.address: tuple[str, int] = (config.host, config.port)
        self._server = None
        self.access: AccessGate | None = None
        self._sweeper: asyncio.Task | None = None
        self.metrics_endpoint: Any = None
        self.metrics_address: tuple[str, int] | None = None
        self._handlers: dict[int, Handler] = {
            Code.REGISTER_BROKER: self.on_register,
            Code.UNREGISTER_BROKER: self.on_unregister,
            Code.GET_ROUTE: self.on_get_route,
            Code.GET_CLUSTER_INFO: self.on_cluster_info,
            Code.NAMESERVER_INFO: self.on_info,
        }
        self.controller: Any = None  # a Controller when config.controller_peers is set (docs/controller.md)
        if config.controller_peers:
            from equeue_core.controller.service import Controller

            self.controller = Controller(config)
            self.registry.master_of = self.controller.master_of
            self._handlers.update(self.controller.handlers)
        else:
            self._handlers.update(dict.fromkeys((Code.CONTROLLER_HEARTBEAT, Code.CONTROLLER_INFO, Code.ELECT_MASTER),
                                                self.on_no_controller))

    async def start(self) -> None:
        cfg = self.config
        transport = self.plugins.transport(cfg.transport)
        self.access = access_gate(cfg, self.plugins)  # checks requests as the broker does (docs/security.md)
        self._server = await transport.serve(cfg.host, cfg.port, self, server_settings(cfg))
        self.address = tuple(self._server.address)[:2]  # type: ignore[assignment]
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        if self.controller is not None:
            self.controller.start()
        if cfg.nameserver_metrics_port:
            from equeue_core.broker.prometheus import MetricsEndpoint
            from equeue_core.nameserver import metrics

            self.metrics_endpoint = MetricsEndpoint(self.metrics_snapshot, asyncio.get_running_loop(),
                                                    metrics.families)
            try:
                self.metrics_address = self.metrics_endpoint.start(cfg.metrics_host, cfg.nameserver_metrics_port)
            except BaseException:
                await self.stop()
                raise

    async def metrics_snapshot(self) -> dict[str, Any]:
        """What a scrape renders (equeue_core/nameserver/metrics.py), taken on the event loop."""
        info = self.registry.cluster_info(count=False).to_wire()
        per_cluster: dict[str, int] = {}
        for b in info["brokers"]:  # every member of every group counts
            per_cluster[b["cluster"]] = per_cluster.get(b["cluster"], 0) + 1
        snap = {"address": f"{self.address[0]}:{self.address[1]}", "transport": self.config.transport,
                "clusters": per_cluster, "brokers": info["brokers"], "stats": self.registry.stats.as_dict()}
        if self.controller is not None:
            snap["controller"] = self.controller.metrics_snapshot()
        return snap

    async def stop(self) -> None:
        if self.metrics_endpoint is not None:
            await asyncio.to_thread(self.metrics_endpoint.close)
            self.metrics_endpoint = None
        if self.controller is not None:
            await self.controller.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._server is not None:
            await self._server.close()
        if self.access is not None:
            self.access.close()

    async def _sweep_forever(self) -> None:
        interval = sweep_interval(self.registry.expiry_s)
        while True:
            await asyncio.sleep(interval)
            self.registry.expire()

    # ------------------------------------------------------------ transport callbacks

    async def handle(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        return await dispatch(self._handlers, conn, frame, log, self.access)

    def connection_lost(self, conn: ServerConnection) -> None:
        self.registry.connection_lost(conn.id)
        if self.controller is not None:
            self.controller.connection_lost(conn.id)

    # ------------------------------------------------------------ requests

    @staticmethod
    def _broker_key(header: dict) -> tuple[str, str, str]:
        cluster, name = header_str(header, "cluster"), header_str(header, "name")
        address = header_str(header, "address")
        try:
            check_broker_name("cluster", cluster)
            check_broker_name("broker name", name)
        except ConfigError as e:
            raise ProtocolError(str(e)) from None
        if "://" not in address:
            raise ProtocolError(f"header field 'address' must be scheme://host:port, not {address!r}")
        return cluster, name, address

    async def on_register(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        cluster, name, address = self._broker_key(h)
        topics = topics_from_wire(h.get("topics"))
        role = h.get("role", "master")
        if role not in ("master", "replica"):
            raise ProtocolError(f"header field 'role' must be 'master' or 'replica', not {role!r}")
        self.registry.register(cluster, name, address, topics, header_int(h, "data_version"), conn.id,
                               optional_int(h, "broker_id"), role, optional_int(h, "epoch"),
                               optional_int(h, "log_end"))
        return frame.response({"cluster": cluster, "name": name, "expiry_s": self.registry.expiry_s})

    async def on_unregister(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        removed = self.registry.unregister(*self._broker_key(frame.header))
        return None if frame.is_oneway else frame.response({"removed": removed})

    async def on_no_controller(self, conn: ServerConnection, frame: Frame) -> Frame:
        raise NoControllerError(f"name server {self.address[0]}:{self.address[1]} runs no controller "
                                "(start it with --controller-peers and --controller-port)")

    async def on_get_route(self, conn: ServerConnection, frame: Frame) -> Frame:
        return frame.response(self.registry.route(header_str(frame.header, "topic")).to_wire())

    async def on_cluster_info(self, conn: ServerConnection, frame: Frame) -> Frame:
        return frame.response(self.registry.cluster_info().to_wire())

    async def on_info(self, conn: ServerConnection, frame: Frame) -> Frame:
        from equeue_core import __version__

        return frame.response({"address": f"{self.address[0]}:{self.address[1]}",
                               "transport": self.config.transport, "version": __version__,
                               "expiry_s": self.registry.expiry_s, "brokers": len(self.registry.brokers),
                               "stats": self.registry.stats.as_dict()})


async def run_nameserver(config: Config, ready: Callable[[NameServer], None] | None = None,
                         stop_event: asyncio.Event | None = None) -> None:
    """Run a name server until stop_event is set (or forever)."""
    server = NameServer(config)
    await server.start()
    try:
        if ready:
            ready(server)
        await (stop_event or asyncio.Event()).wait()
    finally:
        await server.stop()
