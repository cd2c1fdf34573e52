"""Runs the bank end to end: broker (its own on a free port unless one is given), processor
processes, the transfer saga, the SQLite read model, and concurrent senders of random transfers;
then checks the books: money is conserved, every account's balance in the read model equals the
replay of its events from the event store, every transfer ended completed or cancelled."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from equeue_cqrs import CommandBus, EventConsumer, open_event_store
from equeue_cqrs.messages import decode

from . import domain as d
from .read_model import BankReadModel
from .saga import TransferSaga

ROOT = Path(__file__).resolve().parents[2]
COMMANDS, EVENTS = "bank-commands", "bank-events"
INITIAL_BALANCE = 10_000


@dataclass
class BankConfig:
    accounts: int = 100
    transfers: int = 10_000
    senders: int = 4
    frozen: int = 5  # accounts frozen before the transfers: credits to them are refunded (compensation)
    processors: int = 2
    store: str = "lmdb"
    broker: str | None = None
    data_dir: str | None = None
    seed: int = 7
    timeout: float = 300.0


@dataclass
class BankReport:
    seconds: float = 0.0
    transfers: dict[str, int] = field(default_factory=dict)
    money_before: int = 0
    money_after_read_model: int = 0
    money_after_event_store: int = 0
    accounts_matching_replay: int = 0
    accounts: int = 0
    refunds: int = 0
    processor_stats: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.money_before == self.money_after_read_model == self.money_after_event_store
                and self.accounts_matching_replay == self.accounts
                and sum(self.transfers.get(s, 0) for s in ("completed", "cancelled")) == sum(self.transfers.values()))


@contextmanager
def broker_at(address: str | None, data_dir: Path):
    """The given broker, or a broker process of our own on a free port (stopped on the way out)."""
    if address:
        yield address
        return
    sys.path.insert(0, str(ROOT))
    from tests.helpers.broker import BrokerProcess  # the project's one "broker on a free port" helper

    broker = BrokerProcess(data_dir / "broker").start()
    try:
        yield broker.address
    finally:
        broker.stop()


class Processors:
    """The processor processes (one for RocksDB: a RocksDB directory has one owner)."""

    def __init__(self, address: str, store: str, path: str, count: int) -> None:
        self.procs = []
        for _ in range(1 if store == "rocksdb" else count):
            p = subprocess.Popen([sys.executable, "-m", "examples.bank.processor", address, store, path],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True)
            self.procs.append(p)
            line = p.stdout.readline().strip() if p.stdout else ""
            if line != "ready":
                self.stop()
                raise RuntimeError("a bank processor did not start")

    def stop(self) -> list[dict]:
        stats = []
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                out = p.communicate(timeout=120)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate(timeout=10)[0]
            lines = (out or "").strip().splitlines()
            stats.append(json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {})
        self.procs = []
        return stats


def _send_transfers(address: str, ids: list[str], accounts: list[str], seed: int, errors: list) -> None:
    rng = random.Random(seed)
    try:
        with CommandBus(address, COMMANDS) as bus:
            futures = []
            for tid in ids:
                source, target = rng.sample(accounts, 2)
                futures.append(bus.submit(d.StartTransfer(aggregate_id=tid, source=source, target=target,
                                                          amount=rng.randint(1, 400))))
            for f in futures:
                if not f.result(300).ok:
                    errors.append(f.result().message)
    except Exception as e:  # reported by run(): a sender must not die silently
        errors.append(repr(e))


def run(config: BankConfig, log=print) -> BankReport:
    data_dir = Path(config.data_dir or tempfile.mkdtemp(prefix="equeue-bank-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    events_path = str(data_dir / f"events-{config.store}")
    accounts = [f"acct-{i:03d}" for i in range(config.accounts)]
    report = BankReport(accounts=len(accounts), money_before=INITIAL_BALANCE * len(accounts))
    with broker_at(config.broker, data_dir) as address:
        read_model = BankReadModel(str(data_dir / "read-model.sqlite"))
        processors = Processors(address, config.store, events_path, config.processors)
        try:
            with CommandBus(address, COMMANDS) as bus, \
                    EventConsumer(address, "bank-read-model", read_model, EVENTS, batch=256).start(), \
                    EventConsumer(address, "bank-transfer-saga", TransferSaga(bus), EVENTS, batch=256).start():
                for f in [bus.submit(d.OpenAccount(aggregate_id=a, owner=f"owner of {a}", initial=INITIAL_BALANCE))
                          for a in accounts]:
                    f.result(120)
                for a in random.Random(config.seed).sample(accounts, config.frozen):
                    bus.send(d.FreezeAccount(aggregate_id=a))
                log(f"{len(accounts)} accounts open ({config.frozen} frozen); sending {config.transfers} "
                    f"transfers from {config.senders} senders to {len(processors.procs)} processor(s)")
                start = time.perf_counter()
                ids = [f"t-{i:06d}" for i in range(config.transfers)]
                errors: list[str] = []
                senders = [threading.Thread(target=_send_transfers, args=(address, ids[i::config.senders], accounts,
                                                                          config.seed + i, errors))
                           for i in range(config.senders)]
                for t in senders:
                    t.start()
                for t in senders:
                    t.join(config.timeout)
                if errors:
                    raise RuntimeError(f"{len(errors)} transfers were not started: {errors[:3]}")
                deadline = time.monotonic() + config.timeout
                while time.monotonic() < deadline:
                    counts = read_model.transfer_counts()
                    if counts.get("completed", 0) + counts.get("cancelled", 0) == config.transfers:
                        break
                    time.sleep(0.1)
                report.seconds = round(time.perf_counter() - start, 2)
                report.transfers = read_model.transfer_counts()
                report.money_after_read_model = sum(read_model.balances().values())
        finally:
            report.processor_stats = processors.stop()
        balances = read_model.balances()
        read_model.close()
    _audit(report, events_path, config.store, accounts, balances)
    return report


def _audit(report: BankReport, events_path: str, store_name: str, accounts: list[str],
           balances: dict[str, int]) -> None:
    """Replay every account from the event store and compare with the read model."""
    store = open_event_store(store_name, events_path)
    try:
        total = 0
        for a in accounts:
            account = d.Account.empty(a)
            for e in store.read_events(a):
                event = decode(e.type, e.payload)
                account.apply(event)
                report.refunds += isinstance(event, d.TransferRefunded)
            total += account.balance
            report.accounts_matching_replay += account.balance == balances.get(a) and account.balance >= 0
        report.money_after_event_store = total
    finally:
        store.close()


def as_json(report: BankReport) -> str:
    return json.dumps({**asdict(report), "ok": report.ok})
