"""`python -m examples.bank [--transfers N] [--accounts N] [--senders N] [--processors N]
[--store lmdb|rocksdb] [--broker tcp://HOST:PORT] [--data-dir DIR]`: run the bank and audit it."""

from __future__ import annotations

import argparse
import logging
import sys

from .app import BankConfig, as_json, run


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.bank", description=__doc__)
    defaults = BankConfig()
    ap.add_argument("--transfers", type=int, default=defaults.transfers)
    ap.add_argument("--accounts", type=int, default=defaults.accounts)
    ap.add_argument("--senders", type=int, default=defaults.senders)
    ap.add_argument("--processors", type=int, default=defaults.processors)
    ap.add_argument("--frozen", type=int, default=defaults.frozen)
    ap.add_argument("--store", default=defaults.store)
    ap.add_argument("--broker", help="a running broker (default: start one on a free port and stop it after)")
    ap.add_argument("--data-dir", help="where the event store and read model go (default: a temp dir)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report = run(BankConfig(accounts=args.accounts, transfers=args.transfers, senders=args.senders,
                            frozen=args.frozen, processors=args.processors, store=args.store,
                            broker=args.broker, data_dir=args.data_dir), log=lambda s: print(s, flush=True))
    print(f"{sum(report.transfers.values())} transfers in {report.seconds}s: {report.transfers}; "
          f"{report.refunds} refunded (compensation); money {report.money_before} -> "
          f"{report.money_after_read_model} (read model), {report.money_after_event_store} (event store); "
          f"{report.accounts_matching_replay}/{report.accounts} accounts equal the replay of their events")
    print(as_json(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
