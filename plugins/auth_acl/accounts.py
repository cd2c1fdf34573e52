"""The ACL file: one `[[accounts]]` table per account, compiled once per load into cheap rules."""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass
from typing import Any

from equeue_core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class NameRule:
    """Names an account may use: exact names, prefixes (written `orders.*`), or everything (`*`)."""

    everything: bool
    exact: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def parse(cls, where: str, values: Any) -> NameRule:
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise ConfigError(f"{where} must be a list of names or prefixes ending in '*'")
        return cls("*" in values, frozenset(v for v in values if not v.endswith("*")),
                   tuple(v[:-1] for v in values if v.endswith("*") and v != "*"))

    def allows(self, name: str) -> bool:
        return self.everything or name in self.exact or (bool(self.prefixes) and name.startswith(self.prefixes))


@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret: bytes
    topics: NameRule
    groups: NameRule
    admin: bool
    addresses: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]  # empty = from anywhere

    def address_allowed(self, peer: str) -> bool:
        if not self.addresses:
            return True
        host = peer.rsplit(":", 1)[0].strip("[]") if ":" in peer else peer
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:  # a transport that cannot name its peer: an address-bound account is refused
            return False
        return any(ip in net for net in self.addresses)


_KEYS = {"access_key", "secret_key", "topics", "groups", "admin", "addresses"}


def parse_accounts(data: dict[str, Any], path: str) -> dict[str, Account]:
    tables = data.get("accounts")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"ACL file {path}: needs at least one [[accounts]] table")
    extra = set(data) - {"accounts"}
    if extra:
        raise ConfigError(f"ACL file {path}: unknown key(s) {', '.join(sorted(extra))}")
    out: dict[str, Account] = {}
    for i, t in enumerate(tables, 1):
        where = f"ACL file {path}: account #{i}"
        unknown = set(t) - _KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        ak, sk = t.get("access_key"), t.get("secret_key")
        if not isinstance(ak, str) or not ak or len(ak.encode()) > 255:
            raise ConfigError(f"{where}: access_key must be a string of 1-255 bytes")
        if not isinstance(sk, str) or len(sk) < 8:
            raise ConfigError(f"{where} ({ak}): secret_key must be a string of at least 8 characters")
        if ak in out:
            raise ConfigError(f"{where}: access_key {ak!r} appears twice")
        admin = t.get("admin", False)
        if not isinstance(admin, bool):
            raise ConfigError(f"{where} ({ak}): admin must be true or false")
        addrs = t.get("addresses", [])
        if not isinstance(addrs, list):
            raise ConfigError(f"{where} ({ak}): addresses must be a list of CIDRs")
        try:
            nets = tuple(ipaddress.ip_network(a, strict=False) for a in addrs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where} ({ak}): bad address range: {e}") from None
        out[ak] = Account(ak, sk.encode(), NameRule.parse(f"{where} ({ak}): topics", t.get("topics", [])),
                          NameRule.parse(f"{where} ({ak}): groups", t.get("groups", [])), admin, nets)
    return out


def load_accounts(path: str) -> dict[str, Account]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"ACL file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"ACL file {path}: {e}") from None
    return parse_accounts(data, path)
