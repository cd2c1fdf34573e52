"""AclAuthorizer: verifies each request's HMAC and checks it against the account's rights.

Per frame: one dict lookup for the account (rules compiled at load), one HMAC-SHA256 over the
canonical form (equeue_core.signing; a batch send is one frame), one time-window check and one
nonce-cache insert. The file is re-read on a background thread when its mtime changes; a broken
file keeps the last good accounts and logs one line.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict

from equeue_plugins.auth_acl.accounts import Account, load_accounts

from equeue_core import access, signing
from equeue_core.config import Config
from equeue_core.errors import AccessDeniedError, ConfigError
from equeue_core.frame import Frame

log = logging.getLogger("equeue.security")

NONCE_CACHE_MAX = 1_000_000


class NonceCache:
    """Nonces seen within the last 2 x window (a signed request is accepted only within +-window of
    its timestamp, so an older nonce can no longer be replayed). Bounded: when full, new requests
    are refused rather than old nonces forgotten, so a replay can never slip through."""

    def __init__(self, window_s: float, max_entries: int = NONCE_CACHE_MAX) -> None:
        self.keep_s = 2 * window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def add(self, nonce: bytes, now: float) -> bool:
        """True if the nonce is new (and is now remembered), False for a replay."""
        seen = self._seen
        horizon = now - self.keep_s
        while seen:
            first = next(iter(seen.values()))
            if first >= horizon:
                break
            seen.popitem(last=False)
        if nonce in seen:
            return False
        if len(seen) >= self.max_entries:
            raise AccessDeniedError("too many signed requests within the replay window; retry later",
                                    reason="nonce_cache_full")
        seen[nonce] = now
        return True


class AclAuthorizer:
    def __init__(self, path: str, window_s: float = 60.0, reload_s: float = 2.0) -> None:
        self.path = path
        self.window_ms = int(window_s * 1000)
        self.accounts: dict[str, Account] = load_accounts(path)  # a broken file at start is fatal
        self._mtime = self._stat()
        self.nonces = NonceCache(window_s)
        self.reloads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(reload_s,), name="acl-reload", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Config) -> AclAuthorizer:
        if not config.acl_file:
            raise ConfigError("the acl authorizer needs acl_file (the TOML file of [[accounts]])")
        return cls(config.acl_file, config.acl_window_s, config.acl_reload_s)

    # ------------------------------------------------------------ reloading, off the event loop

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _watch(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.reload_if_changed()

    def reload_if_changed(self) -> bool:
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            accounts = load_accounts(self.path)
        except ConfigError as e:
            log.error("ACL file not reloaded, keeping the last good one (%d accounts): %s", len(self.accounts), e)
            return False
        self.accounts = accounts  # one reference swap: the event loop sees old or new, never half
        self.reloads += 1
        log.info("ACL file %s reloaded: %d accounts", self.path, len(accounts))
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ the check, on the event loop

    def authorize(self, frame: Frame, peer: str) -> str:
        header = frame.header
        request = access.request_name(frame.code)
        auth = header.get(signing.AUTH_FIELD)
        if not isinstance(auth, dict):
            raise AccessDeniedError(f"access denied ({request}): the request is not signed (give access_key/secret_key)",
                                    request=request, reason="unsigned")
        ak, ts, nonce, sig = auth.get("ak"), auth.get("ts"), auth.get("nonce"), auth.get("sig")
        if (not isinstance(ak, str) or not isinstance(ts, int) or isinstance(ts, bool)
                or not isinstance(nonce, bytes) or len(nonce) != signing.NONCE_SIZE
                or not isinstance(sig, bytes)):
            raise AccessDeniedError(f"access denied ({request}): malformed signature fields", request=request,
                                    reason="malformed")
        account = self.accounts.get(ak)
        if account is None:
            raise AccessDeniedError(f"access denied ({request}): unknown access key {ak[:64]!r}", request=request,
                                    account=ak[:64], reason="unknown_account")
        if not account.address_allowed(peer):
            raise AccessDeniedError(f"access denied ({request}): account {ak!r} may not connect from {peer}",
                                    request=request, account=ak, peer=peer, reason="address")
        if not signing.verify(account.secret, frame.code, header, frame.body, ak, ts, nonce, sig):
            raise AccessDeniedError(f"access denied ({request}): bad signature for account {ak!r} (wrong secret?)",
                                    request=request, account=ak, reason="signature")
        now = time.time()
        if abs(now * 1000 - ts) > self.window_ms:
            raise AccessDeniedError(
                f"access denied ({request}): timestamp {ts} is outside the {self.window_ms // 1000}s window "
                f"(check the client's clock)", request=request, account=ak, reason="stale")
        if not self.nonces.add(nonce, now):
            raise AccessDeniedError(f"access denied ({request}): replayed request (nonce already seen) from account {ak!r}",
                                    request=request, account=ak, reason="replay")
        kind, resource = access.needs(frame.code, header)
        if kind == access.ANY:
            return ak
        if kind == access.ADMIN:
            if not account.admin:
                raise AccessDeniedError(f"access denied ({request}): account {ak!r} is not an admin",
                                        request=request, account=ak, reason="admin")
            return ak
        rule = account.topics if kind == access.TOPIC else account.groups
        if kind == access.TOPIC and isinstance(resource, tuple):  # a SEND_MULTI needs all its topics
            denied = [t for t in resource if not rule.allows(t)]
            if not denied:
                return ak
            resource = denied[0]  # named in the refusal
        if not isinstance(resource, str) or not rule.allows(resource):
            what = "send to topic" if kind == access.TOPIC else "consume with group"
            raise AccessDeniedError(f"access denied ({request}): account {ak!r} may not {what} {resource!r}",
                                    request=request, account=ak, reason=kind,
                                    **{kind: resource if isinstance(resource, str) else repr(resource)})
        return ak
