"""Failover benchmark: the time from `kill -9` of a broker group's master to the first send the
new master acknowledges, with the controller in three name servers.

Three controller name servers and a group of three brokers in controller mode (sync replication
unless --replication async), each its own process on 127.0.0.1; two producer threads send
continuously through the name servers. Each cycle kills the master, waits for the new one and
the first acknowledged send on it, then restarts the killed broker and waits until it is back in
the in-sync set. Prints one JSON line per cycle and a summary line (tests/helpers/failover.py
does the work, the same code as tests/controller/test_failover_e2e.py).

    .venv/bin/python -m bench.bench_failover                 # 5 cycles, sync replication
    .venv/bin/python -m bench.bench_failover --cycles 10 --replication async

`elected_s`: kill to the controller's committed election; `first_send_s`: kill to the first send
acknowledged by the new master (what a producer sees). Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from tests.helpers.failover import ControlledGroup, Senders, kill_master_once


def run(cycles: int, replication: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="equeue-bench-failover-"))
    group = ControlledGroup(tmp, replication=replication).start()
    senders = None
    results = []
    try:
        g = group.wait_master(30)
        group.wait_in_sync({i for i in range(group.members) if i != g["master_id"]}, 60)
        group.create_topic("bench", 4)
        senders = Senders(group.nameserver, "bench").start()
        for cycle in range(cycles):
            r = kill_master_once(group, senders, election_bound_s=30)
            r.update(bench="failover", cycle=cycle, replication=replication)
            print(json.dumps(r), flush=True)
            results.append(r)
            group.brokers[r["old_master"]].start()
            group.wait_in_sync({r["old_master"]}, 90)
        first = [r["first_send_s"] for r in results]
        elected = [r["elected_s"] for r in results]
        print(json.dumps({"bench": "failover_summary", "replication": replication, "cycles": cycles,
                          "first_send_s_median": statistics.median(first), "first_send_s_max": max(first),
                          "elected_s_median": statistics.median(elected), "elected_s_max": max(elected),
                          "acknowledged": len(senders.acked), "failed_sends": senders.failures}), flush=True)
    finally:
        if senders is not None:
            senders.stop()
        group.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--replication", choices=["sync", "async"], default="sync")
    args = ap.parse_args()
    run(args.cycles, args.replication)


if __name__ == "__main__":
    main()
