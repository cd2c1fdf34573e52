"""Run every benchmark in one go (`make bench`), each printing JSON lines; the lines are also
appended to bench/results/<UTC date>.jsonl. Sizes are smaller than each script's default so the
whole run stays within a few minutes; run a script alone for the full-size figures."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUNS = [
    ["bench.bench_broker", "--count", "200000"],
    ["bench.bench_latency", "--seconds", "3", "--single-count", "5000", "--scan-count", "50000"],
    ["bench.bench_transports", "--duration", "2"],
    ["bench.bench_stores", "--records", "200000"],
    ["bench.bench_spark", "--messages", "300000"],
    ["bench.bench_cqrs", "--count", "40000"],
    ["bench.bench_queues", "--count", "50000"],
    ["bench.bench_sections", "--count", "100000", "--rounds", "3"],
    ["bench.bench_push_handoff", "--count", "5000", "--models", "loop,pulling"],
    ["bench.peers"],  # EQueue against Redis Streams, NATS JetStream, RabbitMQ (bench/peers/)
]


def main() -> int:
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{dt.datetime.now(dt.UTC):%Y-%m-%d}.jsonl"
    failed = 0
    for args in RUNS:
        print(f"# {' '.join(args)}", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        with out.open("a") as f:
            f.writelines(line + "\n" for line in lines)
        print("\n".join(lines), flush=True)
        tables = [line for line in proc.stdout.splitlines() if line.startswith("|")]
        if tables:  # a run's summary table (bench.peers prints its ratios)
            print("\n".join(tables), file=sys.stderr, flush=True)
        if proc.returncode:
            failed += 1
            print(proc.stderr[-2000:], file=sys.stderr)
    print(f"# results appended to {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
