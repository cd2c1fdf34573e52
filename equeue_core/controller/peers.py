"""The controller's Raft peer list: `host:port,host:port,...`, every name server's Raft port."""

from __future__ import annotations

from equeue_core.errors import ConfigError


def controller_peers(text: str, host: str, port: int) -> tuple[str, list[str]]:
    """(this name server's Raft address, the other peers'). ConfigError when the list is malformed,
    when `host:port` is not in it (each name server must find itself), or when it has fewer than
    three peers (with two, losing either stops every decision, which is worse than one)."""
    peers: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        h, sep, p = part.rpartition(":")
        if not sep or not h or not p.isdigit() or not 0 < int(p) <= 65535:
            raise ConfigError(f"controller peer {part!r} must be host:port")
        if part not in peers:
            peers.append(part)
    me = f"{host}:{port}"
    if me not in peers:
        raise ConfigError(f"controller_peers {text!r} must list this name server's own Raft address {me} "
                          "(--host and --controller-port)")
    if len(peers) < 3:
        raise ConfigError(f"controller_peers {text!r}: a controller needs at least 3 peers (a majority must "
                          "survive the loss of one)")
    return me, [p for p in peers if p != me]
