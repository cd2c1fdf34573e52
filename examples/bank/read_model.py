"""The bank's read model: accounts and transfers in SQLite, fed by a projection on the events topic.

Idempotent by event id: each batch is one transaction that first inserts the event id into
`processed_events` (a primary key) and applies the event only if that insert took, so a batch
delivered twice changes nothing the second time. Events of one aggregate arrive in version order
(one queue, one batch at a time), which is all the balance arithmetic needs.
"""

from __future__ import annotations

import sqlite3
import threading

from equeue_cqrs import EventMeta, Projection, event_handler

from . import domain as d

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, owner TEXT, balance INTEGER NOT NULL,
                                     frozen INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS transfers (id TEXT PRIMARY KEY, source TEXT, target TEXT, amount INTEGER,
                                      status TEXT NOT NULL, reason TEXT);
CREATE TABLE IF NOT EXISTS processed_events (event_id TEXT PRIMARY KEY);
"""


class BankReadModel(Projection):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()  # the consumer may call from several worker threads

    def project(self, items) -> None:
        with self.lock:
            self.db.execute("BEGIN")
            try:
                for event, meta in items:
                    if self.db.execute("INSERT OR IGNORE INTO processed_events VALUES (?)",
                                       (meta.event_id,)).rowcount:
                        self.dispatch(event, meta)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def _balance(self, meta: EventMeta, delta: int) -> None:
        self.db.execute("UPDATE accounts SET balance = balance + ?, version = ? WHERE id = ?",
                        (delta, meta.version, meta.aggregate_id))

    @event_handler(d.AccountOpened)
    def _opened(self, e: d.AccountOpened, meta: EventMeta) -> None:
        self.db.execute("INSERT INTO accounts (id, owner, balance, version) VALUES (?, ?, ?, ?)",
                        (meta.aggregate_id, e.owner, e.initial, meta.version))

    @event_handler(d.Deposited)
    def _deposited(self, e: d.Deposited, meta: EventMeta) -> None:
        self._balance(meta, e.amount)

    @event_handler(d.Withdrawn)
    def _withdrawn(self, e: d.Withdrawn, meta: EventMeta) -> None:
        self._balance(meta, -e.amount)

    @event_handler(d.AccountFrozen)
    def _frozen(self, e: d.AccountFrozen, meta: EventMeta) -> None:
        self.db.execute("UPDATE accounts SET frozen = 1, version = ? WHERE id = ?", (meta.version, meta.aggregate_id))

    @event_handler(d.TransferDebited)
    def _debited(self, e: d.TransferDebited, meta: EventMeta) -> None:
        self._balance(meta, -e.amount)

    @event_handler(d.TransferCredited)
    def _credited(self, e: d.TransferCredited, meta: EventMeta) -> None:
        self._balance(meta, e.amount)

    @event_handler(d.TransferRefunded)
    def _refunded(self, e: d.TransferRefunded, meta: EventMeta) -> None:
        self._balance(meta, e.amount)

    @event_handler(d.TransferStarted)
    def _started(self, e: d.TransferStarted, meta: EventMeta) -> None:
        self.db.execute("INSERT INTO transfers (id, source, target, amount, status) VALUES (?, ?, ?, ?, 'started')",
                        (meta.aggregate_id, e.source, e.target, e.amount))

    @event_handler(d.TransferCompleted)
    def _completed(self, e: d.TransferCompleted, meta: EventMeta) -> None:
        self.db.execute("UPDATE transfers SET status = 'completed' WHERE id = ?", (meta.aggregate_id,))

    @event_handler(d.TransferCancelled)
    def _cancelled(self, e: d.TransferCancelled, meta: EventMeta) -> None:
        self.db.execute("UPDATE transfers SET status = 'cancelled', reason = ? WHERE id = ?",
                        (e.reason, meta.aggregate_id))

    # -- queries ---------------------------------------------------------------------------------

    def balances(self) -> dict[str, int]:
        with self.lock:
            return dict(self.db.execute("SELECT id, balance FROM accounts"))

    def transfer_counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.db.execute("SELECT status, COUNT(*) FROM transfers GROUP BY status"))

    def close(self) -> None:
        self.db.close()
