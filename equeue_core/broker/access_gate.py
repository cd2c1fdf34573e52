"""The broker's side of access control: runs the configured authorizer before every handler,
counts denials and logs them (account and peer, at most one line per second per account+peer
and request, with a count of the ones held back), so a flood of bad requests cannot flood the log."""

from __future__ import annotations

import logging
import time
from typing import Any

from equeue_core.contracts import Authorizer, ServerConnection
from equeue_core.errors import AccessDeniedError
from equeue_core.frame import Frame

log = logging.getLogger("equeue.security")

LOG_EVERY_S = 1.0
_MAX_LOG_KEYS = 10_000


class AccessGate:
    def __init__(self, authorizer: Authorizer, name: str) -> None:
        self.authorizer = authorizer
        self.name = name
        self.denied = 0
        self._last_log: dict[tuple[str, str, str], list[Any]] = {}

    def check(self, conn: ServerConnection, frame: Frame) -> None:
        """Raise AccessDeniedError (counted and logged) unless the authorizer lets the frame through."""
        peer = getattr(conn, "peer", "") or ""
        try:
            self.authorizer.authorize(frame, peer)
        except AccessDeniedError as e:
            self.denied += 1
            self._log(e, peer)
            raise

    def _log(self, e: AccessDeniedError, peer: str) -> None:
        key = (str(e.details.get("account", "")), peer, str(e.details.get("request", "")))
        now = time.monotonic()
        entry = self._last_log.get(key)
        if entry is not None and now - entry[0] < LOG_EVERY_S:
            entry[1] += 1
            return
        held = entry[1] if entry is not None else 0
        if len(self._last_log) >= _MAX_LOG_KEYS:
            self._last_log.clear()
        self._last_log[key] = [now, 0]
        log.warning("account=%s peer=%s: %s%s", key[0] or "-", peer or "-", e,
                    f" (+{held} more like it held back)" if held else "")

    def close(self) -> None:
        self.authorizer.close()
