"""`equeue replication status|promote|demote --broker ADDR`: a broker's replication role by hand
(static failover, docs/replication.md). Prints the broker's ReplicationStatus as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from equeue_core.client.admin import AdminClient
from equeue_core.codes import Code
from equeue_core.errors import EQueueError


def cmd_replication(args: argparse.Namespace) -> int:
    header: dict = {}
    if args.action == "promote":
        code = Code.REPL_PROMOTE
        if args.epoch is not None:
            header["epoch"] = args.epoch
    elif args.action == "demote":
        if not args.master:
            print("equeue replication demote needs --master HOST:PORT", file=sys.stderr)
            return 2
        code = Code.REPL_DEMOTE
        header["master"] = args.master
        if args.epoch is not None:
            header["epoch"] = args.epoch
    else:
        code = Code.REPL_STATUS
    try:
        with AdminClient(args.broker) as admin:
            status = admin.request(code, header)
    except EQueueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2, sort_keys=True))
    return 0
