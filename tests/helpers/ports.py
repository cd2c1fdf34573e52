"""Ports for the processes a test starts, chosen so nothing else in the session can take them first.

A port learned by binding port 0 and closing the socket comes from the kernel's ephemeral range,
the same range every outgoing connection draws its local port from. Between the moment a test
picks such a port and the moment its broker binds it (seconds, when name servers elect a Raft
leader first), any client or Raft peer connecting anywhere may be given that very port, and the
broker dies with "Address already in use" (CI run of 2026-11-28, test_cluster_nameserver).

So `free_port` picks from outside `net.ipv4.ip_local_port_range`, where no connect() lands, and
never hands the same port twice in one session (a stopped broker's port may still be in
TIME_WAIT, and a test may not have started the process it took a port for yet). The port is
checked by binding it without SO_REUSEADDR, which fails while anything holds it, TIME_WAIT too.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default ip_local_port_range
_LOWEST = 10000  # below this live the well-known and registered services a host may run
_MIN_SPAN = 1000  # a gap narrower than this is not worth drawing from
_ATTEMPTS = 500

_handed: set[int] = set()
_rng = random.Random()  # seeded from os.urandom: two sessions on one host start apart


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT
    return low, high


def _outside_ephemeral() -> list[range]:
    low, high = _ephemeral_range()
    spans = [range(_LOWEST, low), range(high + 1, 65536)]
    return [s for s in spans if len(s) >= _MIN_SPAN]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port that is free now, outside the ephemeral range, new to this session."""
    spans = _outside_ephemeral()
    if spans:
        weights = [len(s) for s in spans]
        for _ in range(_ATTEMPTS):
            port = _rng.choice(_rng.choices(spans, weights)[0])
            if port not in _handed and _bindable(port):
                _handed.add(port)
                return port
    # no room outside the ephemeral range (or all of it taken): fall back to the kernel's choice
    for _ in range(_ATTEMPTS):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed:
            _handed.add(port)
            return port
    raise RuntimeError(f"no free loopback port after {2 * _ATTEMPTS} attempts")
