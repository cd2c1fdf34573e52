"""Configuration: embedded defaults < TOML file < EQUEUE_<KEY> environment < explicit overrides.

docs/config.md lists every key with its default (tests/test_config_docs.py keeps the two equal).
`validate` checks the values it can check alone, so a bad setting fails at start with one clear
line, not deep inside a plugin; a check that needs the store (the file store's chunk_size against
max_frame_size) is made by the store when it opens. Environment variables set only scalar keys
(`store_options` comes from the file or overrides).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from equeue_core.errors import ConfigError

MiB = 1024 * 1024


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 10911
    data_dir: str = "./data"
    store: str = "file"
    transport: str = "tcp"
    flush: str = "async"
    flush_interval_ms: int = 500
    max_body_size: int = 4 * MiB
    max_frame_size: int = 16 * MiB
    default_queues: int = 4
    auto_create_topics: bool = True
    long_poll_ms: int = 15000
    busy_poll_us: int = 50  # after a request's work, poll the sockets this long before sleeping (broker/busy_poll.py)
    pull_batch: int = 32
    pull_max_bytes: int = 4 * MiB
    offset_persist_ms: int = 5000
    frame_read_timeout_s: float = 30.0
    heartbeat_expiry_s: float = 120.0
    queue_lock_expiry_s: float = 60.0
    retention_hours: float = 72.0
    retention_policy: str = "time_and_consumed"
    retention_check_s: float = 10.0
    disk_high_water: float = 0.85
    delay_levels: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    max_reconsume_times: int = 16
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 10913
    log_format: str = "text"
    nameserver: str = ""  # "host:port,host:port": join a cluster (docs/cluster.md); "" = single node
    broker_name: str = ""  # "" = "<hostname>-<port>"
    cluster: str = "DefaultCluster"
    register_interval_s: float = 30.0
    broker_expiry_s: float = 120.0  # name server: drop a broker silent this long
    nameserver_metrics_port: int = 9878  # name server: Prometheus endpoint port (0 = off), on metrics_host
    controller: bool = False  # broker: let the name servers' controller choose master/replica (docs/controller.md)
    controller_heartbeat_s: float = 1.0  # broker: how often it reports its replication status to the controller
    controller_peers: str = ""  # name server: Raft peers "host:port,..." (all, itself included); "" = no controller
    controller_port: int = 0  # name server: its own Raft port, one of controller_peers (on host)
    controller_master_timeout_s: float = 3.0  # name server: a master silent this long is replaced
    unclean_election: bool = False  # name server: with no in-sync member left, elect any live member anyway
    max_deliver_delay: str = "40d"
    max_connections: int = 4096
    max_connection_bytes: int = 64 * MiB
    idle_timeout_s: float = 600.0
    acl: bool = False  # check every request against acl_file (docs/security.md)
    acl_file: str = ""  # TOML file of [[accounts]]; reloaded when it changes
    # The broker's TLS files. Not named tls_cert/tls_key/tls_ca: EQUEUE_TLS_CA/_CERT/_KEY are the
    # clients' variables, and a broker started in a client's shell must not pick them up.
    tls_server_cert: str = ""  # PEM certificate: the TCP transport serves TLS only (docs/security.md)
    tls_server_key: str = ""  # PEM private key of tls_server_cert
    tls_client_ca: str = ""  # PEM CA: with TLS on, clients must present a certificate it signed (mutual TLS)
    authorizer: str = ""  # authorizer plugin by name; "" = "acl" when acl is on, else none
    acl_window_s: float = 60.0  # signed requests older/newer than this are refused
    acl_reload_s: float = 2.0  # how often the ACL file's mtime is checked
    # CURVE for the zmq transport (docs/security.md). Not named curve_*: EQUEUE_CURVE_* are the clients'.
    zmq_curve_secret_key_file: str = ""  # the server's secret key file (`equeue keys generate`): CURVE only
    zmq_curve_allowed_keys: str = ""  # file or directory of client public keys let in; "" = any client key
    # What this server presents on its own outgoing links (a broker's registration with its name
    # servers): client credentials, as a client's access_key/tls_ca/curve_server_key ... arguments.
    link_access_key: str = ""
    link_secret_key: str = ""
    link_tls_ca: str = ""
    link_tls_cert: str = ""
    link_tls_key: str = ""
    link_curve_server_key: str = ""  # Z85 text or key file of the name servers' public key
    link_curve_secret_key: str = ""  # this link's own key pair; "" = zmq_curve_secret_key_file
    # replication (docs/replication.md)
    role: str = "master"  # static mode: "master" | "replica"
    master_address: str = ""  # a replica's master, "host:port" or "tls://host:port"
    broker_id: int = 0  # unique within the broker group (same cluster and broker_name)
    replication: str = "async"  # "async": answer after the master stored; "sync": after min_insync replicas did
    min_insync: int = 1  # sync replication: replicas that must have a send's bytes before it is answered
    replica_max_lag_bytes: int = 256 * MiB  # a replica further behind leaves the in-sync set
    store_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def authorizer_name(self) -> str:
        """The authorizer plugin to run, or "" for none (the default: no access control)."""
        return self.authorizer or ("acl" if self.acl else "")

    def store_settings_options(self) -> dict[str, Any]:
        return dict(self.store_options.get(self.store, {}))


_FIELDS = {f.name: f for f in fields(Config)}


def _coerce(name: str, value: Any) -> Any:
    kind = _FIELDS[name].type
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "str":
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config {name}: {value!r} is not a valid {kind}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"config {name}: expected a table")
    return value


def validate(cfg: Config) -> Config:
    if cfg.flush not in ("async", "sync"):
        raise ConfigError(f"config flush: {cfg.flush!r} must be 'async' or 'sync'")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"config port: {cfg.port} is not a TCP port")
    if not 0 <= cfg.nameserver_metrics_port <= 65535:
        raise ConfigError(f"config nameserver_metrics_port: {cfg.nameserver_metrics_port} is not a TCP port")
    if cfg.log_format not in ("text", "json"):
        raise ConfigError(f"config log_format: {cfg.log_format!r} must be 'text' or 'json'")
    if not 0 <= cfg.metrics_port <= 65535:
        raise ConfigError(f"config metrics_port: {cfg.metrics_port} is not a TCP port (0 turns metrics off)")
    for name in ("flush_interval_ms", "max_body_size", "max_frame_size", "default_queues",
                 "long_poll_ms", "pull_batch", "offset_persist_ms"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"config {name}: must be positive, got {getattr(cfg, name)}")
    if not 0 <= cfg.busy_poll_us <= 10_000:
        raise ConfigError(f"config busy_poll_us: {cfg.busy_poll_us} must be 0 (off) to 10000")
    if cfg.max_body_size >= cfg.max_frame_size:
        raise ConfigError("config max_body_size must be smaller than max_frame_size")
    if cfg.default_queues > 1024:
        raise ConfigError("config default_queues: at most 1024")
    parse_delay_levels(cfg.delay_levels)
    if parse_duration_ms(cfg.max_deliver_delay) <= 0:
        raise ConfigError("config max_deliver_delay: must be positive")
    if cfg.retention_policy not in ("time_and_consumed", "time", "consumed"):
        raise ConfigError(f"config retention_policy: {cfg.retention_policy!r} must be "
                          "'time_and_consumed', 'time' or 'consumed'")
    if not 0 < cfg.disk_high_water <= 1:
        raise ConfigError(f"config disk_high_water: {cfg.disk_high_water} must be a fraction in (0, 1]")
    if cfg.max_connections <= 0 or cfg.max_connection_bytes <= 0 or cfg.idle_timeout_s < 0:
        raise ConfigError("config max_connections and max_connection_bytes must be positive and "
                          "idle_timeout_s >= 0 (0: never)")
    if cfg.retention_hours < 0 or cfg.retention_check_s <= 0:
        raise ConfigError("config retention_hours must be >= 0 and retention_check_s > 0")
    if cfg.register_interval_s <= 0 or cfg.broker_expiry_s <= 0:
        raise ConfigError("config register_interval_s and broker_expiry_s must be positive")
    from equeue_core.nameserver.routes import check_broker_name

    check_broker_name("config cluster", cfg.cluster)
    if cfg.broker_name:
        check_broker_name("config broker_name", cfg.broker_name)
    if bool(cfg.tls_server_cert) != bool(cfg.tls_server_key) or (cfg.tls_client_ca and not cfg.tls_server_cert):
        raise ConfigError("config tls_server_cert and tls_server_key (--tls-cert, --tls-key) go together; "
                          "tls_client_ca (--tls-ca) needs them")
    if cfg.zmq_curve_allowed_keys and not cfg.zmq_curve_secret_key_file:
        raise ConfigError("config zmq_curve_allowed_keys (--curve-allowed-keys) needs zmq_curve_secret_key_file "
                          "(--curve-secret-key)")
    if bool(cfg.link_access_key) != bool(cfg.link_secret_key):
        raise ConfigError("config link_access_key and link_secret_key go together")
    if cfg.acl and not cfg.acl_file:
        raise ConfigError("config acl = true needs acl_file (the TOML file of [[accounts]])")
    if cfg.acl_window_s <= 0 or cfg.acl_reload_s <= 0:
        raise ConfigError("config acl_window_s and acl_reload_s must be positive")
    if cfg.role not in ("master", "replica"):
        raise ConfigError(f"config role: {cfg.role!r} must be 'master' or 'replica'")
    if cfg.role == "replica" and not cfg.master_address and not getattr(cfg, "controller", False):
        raise ConfigError("config role = 'replica' needs master_address (--master HOST:PORT)")
    if cfg.replication not in ("async", "sync"):
        raise ConfigError(f"config replication: {cfg.replication!r} must be 'async' or 'sync'")
    if cfg.min_insync < 1 or cfg.broker_id < 0 or cfg.replica_max_lag_bytes <= 0:
        raise ConfigError("config min_insync must be >= 1, broker_id >= 0 and replica_max_lag_bytes > 0")
    if cfg.nameserver:
        from equeue_core.nameserver.addresses import parse_nameservers

        parse_nameservers(cfg.nameserver)
    if cfg.controller_heartbeat_s <= 0 or cfg.controller_master_timeout_s <= 0:
        raise ConfigError("config controller_heartbeat_s and controller_master_timeout_s must be positive")
    if cfg.controller and not cfg.nameserver:
        raise ConfigError("config controller = true (--controller) needs nameserver (--nameserver): "
                          "the controller runs in the name servers")
    if cfg.controller_peers:
        from equeue_core.controller.peers import controller_peers

        controller_peers(cfg.controller_peers, cfg.host, cfg.controller_port)
    return cfg


def parse_duration_ms(text: str) -> int:
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    t = text.strip()
    for unit in ("ms", "s", "m", "h", "d"):
        if t.endswith(unit) and t[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(t[: -len(unit)]) * units[unit])
    raise ConfigError(f"{text!r} is not a duration like 500ms, 10s, 5m, 2h")


def parse_delay_levels(text: str) -> list[int]:
    levels = [parse_duration_ms(x) for x in text.split()]
    if not levels:
        raise ConfigError("config delay_levels: at least one level is needed")
    return levels


def load(path: str | None = None, overrides: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> Config:
    """Build the effective config. An unknown key in the file or in `overrides` is an error; an
    EQUEUE_* variable that names no key is ignored (others, such as EQUEUE_LOG_LEVEL, are read
    elsewhere), and EQUEUE_STORE_OPTIONS is ignored too."""
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from None
        for k, v in data.items():
            if k not in _FIELDS:
                raise ConfigError(f"config file {path}: unknown key {k!r}")
            values[k] = _coerce(k, v)
    env = os.environ if environ is None else environ
    for k, v in env.items():
        if not k.startswith("EQUEUE_"):
            continue
        name = k[len("EQUEUE_"):].lower()
        if name in _FIELDS and name != "store_options":
            values[name] = _coerce(name, v)
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k not in _FIELDS:
            raise ConfigError(f"unknown config key {k!r}")
        values[k] = _coerce(k, v)
    return validate(Config(**values))
