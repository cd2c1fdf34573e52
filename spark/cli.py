"""`equeue spark export|report`: the pipeline jobs from the command line.

The main `equeue` CLI hands everything after `spark` to `main(argv)`; it can also run on its own as
`python -m equeue_spark.cli export ...`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from equeue_core.errors import EQueueError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="equeue spark", description="Spark pipeline jobs over stored topics.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="export a topic to Parquet (partitioned by date and queue_id), incrementally")
    e.add_argument("--data-dir", default="./data", help="the broker's data directory (default ./data, as the broker)")
    e.add_argument("--topic", required=True)
    e.add_argument("--to", required=True, dest="to_dir", help="target directory (holds the export state)")
    e.add_argument("--store", default=None, help="store name (default: broker.json's store, else file)")
    e.add_argument("--queues", default=None, help="comma-separated queue ids (default: all)")
    e.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")

    r = sub.add_parser("report", help="per topic and group: messages in, consumed, lag, messages/minute")
    r.add_argument("--data-dir", default="./data", help="the broker's data directory (default ./data, as the broker)")
    r.add_argument("--store", default=None)
    r.add_argument("--out", default=None, help="also write the rows to FILE.parquet or FILE.csv")
    r.add_argument("--window", type=float, default=5.0, help="minutes of the throughput window (default 5)")
    r.add_argument("--topic", action="append", default=None, help="only this topic (repeatable)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one job; returns the process exit code (0 ok, 1 a clear error, 2 bad arguments)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["spark"]:
        args_list = args_list[1:]
    args = _parser().parse_args(args_list)
    try:
        if not os.path.isdir(args.data_dir):  # say so before paying for a Spark session
            raise EQueueError(f"data directory {args.data_dir!r} does not exist")
        if args.command == "export":
            from equeue_spark.jobs import export
            from equeue_spark.session import get_session

            queues = [int(q) for q in args.queues.split(",")] if args.queues else None
            spark = get_session(master=args.master, app_name="equeue-export")
            summary = export.run(args.data_dir, args.topic, args.to_dir, store=args.store,
                                 progress=args.progress, spark=spark, queues=queues)
            print(f"exported {summary['rows']:,} new messages of {args.topic} to {args.to_dir}")
        else:
            from equeue_spark.jobs import report

            report.run(args.data_dir, store=args.store, out=args.out, window_minutes=args.window,
                       topics=args.topic)
        return 0
    except (EQueueError, ValueError, OSError) as e:
        print(f"equeue spark {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
