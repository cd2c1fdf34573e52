"""The bank example end to end: 10k random transfers among 100 accounts from 4 concurrent senders,
two processor processes, the transfer saga and the SQLite read model, on a real broker."""

from __future__ import annotations

import pytest

from examples.bank.app import BankConfig, run
from tests.helpers.broker import start_broker


@pytest.mark.slow
@pytest.mark.parametrize("store_name", ["lmdb", "rocksdb"])
def test_ten_thousand_concurrent_transfers_conserve_money_and_every_account_equals_its_replay(tmp_path, store_name):
    with start_broker(tmp_path) as broker:
        report = run(BankConfig(accounts=100, transfers=10_000, senders=4, frozen=5, processors=2,
                                store=store_name, broker=broker.address, data_dir=str(tmp_path / "bank"),
                                timeout=240), log=lambda _s: None)
    assert sum(report.transfers.values()) == 10_000
    assert set(report.transfers) <= {"completed", "cancelled"}  # every saga reached an end
    assert report.money_after_read_model == report.money_before == 100 * 10_000
    assert report.money_after_event_store == report.money_before
    assert report.accounts_matching_replay == 100
    assert report.transfers.get("completed", 0) > 0 and report.refunds > 0  # credits and compensations ran
    assert report.ok
    if store_name == "lmdb":  # two processor processes shared the commands topic's queues
        assert len(report.processor_stats) == 2 and all(s["handled"] > 0 for s in report.processor_stats)
