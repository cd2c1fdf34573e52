"""Broker addresses: `scheme://host:port`, where the scheme names the transport plugin.

A bare `host:port` means the default transport (tcp).
"""

from __future__ import annotations

from dataclasses import dataclass

from equeue_core.errors import ConfigError

DEFAULT_TRANSPORT = "tcp"
DEFAULT_PORT = 10911


@dataclass(frozen=True, slots=True)
class Address:
    transport: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.transport}://{self.host}:{self.port}"


def parse_address(text: str, default_transport: str = DEFAULT_TRANSPORT) -> Address:
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"broker address {text!r} is empty")
    s = text.strip()
    transport = default_transport
    if "://" in s:
        transport, s = s.split("://", 1)
        if not transport:
            raise ConfigError(f"broker address {text!r} has an empty scheme")
    host, sep, port_s = s.rpartition(":")
    if not sep:
        host, port_s = s, str(DEFAULT_PORT)
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_s)
    except ValueError:
        raise ConfigError(f"broker address {text!r}: {port_s!r} is not a port") from None
    if not 0 < port < 65536:
        raise ConfigError(f"broker address {text!r}: port out of range")
    return Address(transport, host, port)
