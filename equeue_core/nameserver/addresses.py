"""Name server address lists: `host:port,host:port` (a scheme picks the transport, default tcp;
a missing port means 9876, RocketMQ's name server port)."""

from __future__ import annotations

from equeue_core.client.address import Address, parse_address
from equeue_core.errors import ConfigError

DEFAULT_NAMESERVER_PORT = 9876


def parse_nameserver(text: str) -> Address:
    s = text.strip()
    rest = s.split("://", 1)[-1]
    has_port = "]:" in rest if rest.startswith("[") else ":" in rest
    if rest and not has_port:
        s = f"{s}:{DEFAULT_NAMESERVER_PORT}"
    try:
        return parse_address(s)
    except ConfigError as e:
        raise ConfigError(f"name server address {text!r}: {e}") from None


def parse_nameservers(text: str) -> list[Address]:
    """Every address of a comma-separated list, in order, duplicates removed; ConfigError on a bad
    one or an empty list, so a typo stops a broker at start instead of being retried forever."""
    parts = [p for p in (text or "").split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"name server list {text!r} names no address (expected host:port[,host:port...])")
    out: list[Address] = []
    for p in parts:
        a = parse_nameserver(p)
        if a not in out:
            out.append(a)
    return out
