"""The `equeue` command: broker, produce, consume, topics, groups, plugins, spark.

Every expected failure prints one line to stderr and exits 1; only a bug shows a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from equeue_core import logs
from equeue_core.cli.progress import ProgressReport
from equeue_core.errors import EQueueError

DEFAULT_BROKER = "127.0.0.1:10911"


# ---------------------------------------------------------------- broker

def cmd_broker(args: argparse.Namespace) -> int:
    from equeue_core import config as config_mod
    from equeue_core.allocator import keep_freed_memory
    from equeue_core.broker.broker import Broker
    from equeue_core.cli.startup_heap import freeze_startup_heap

    overrides = {"data_dir": args.data_dir, "host": args.host, "port": args.port, "flush": args.flush,
                 "store": args.store, "transport": args.transport, "metrics_host": args.metrics_host,
                 "metrics_port": args.metrics_port, "log_format": args.log_format,
                 "nameserver": args.nameserver, "broker_name": args.name, "cluster": args.cluster,
                 "controller": True if args.controller else None,
                 "role": args.role, "master_address": args.master,
                 "broker_id": args.broker_id, "replication": args.replication, "min_insync": args.min_insync,
                 **_server_security_overrides(args)}
    cfg = config_mod.load(args.config, overrides)
    logs.configure(cfg.log_format)
    keep_freed_memory()  # this process's own policy, not Broker's (equeue_core/allocator.py)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        broker = Broker(cfg)
        await broker.start()
        freeze_startup_heap()  # this process's own policy, not Broker's (cli/startup_heap.py)
        _log_recovery(broker)
        rec = broker.recovery
        address = f"{cfg.transport}://{broker.address[0]}:{broker.address[1]}"
        metrics = (f"http://{broker.metrics_address[0]}:{broker.metrics_address[1]}/metrics"
                   if broker.metrics_address else None)
        if cfg.log_format == "json":
            logs.announce("json", f"equeue broker listening on {address}", address=address,
                          data_dir=os.path.abspath(cfg.data_dir), store=cfg.store, transport=cfg.transport,
                          flush=cfg.flush, metrics=metrics, recovery_clean=rec.clean, hot_path=_hot_path())
        else:
            print(f"equeue broker listening on {address}", flush=True)
            print(f"  data dir  {os.path.abspath(cfg.data_dir)}", flush=True)
            print(f"  plugins   store={cfg.store} transport={cfg.transport} flush={cfg.flush} {_hot_path()}",
                  flush=True)
            if metrics:
                print(f"  metrics   {metrics}", flush=True)
            print(f"  recovery  {'clean' if rec.clean else 'after crash'}"
                  f" truncated_bytes={rec.truncated_bytes} rebuilt_entries={rec.rebuilt_entries}", flush=True)
        if broker.registrar is not None:
            reg = broker.registrar
            joined = sum(link.state == "registered" for link in reg.links)
            logs.announce(cfg.log_format, f"  cluster   {reg.cluster}/{reg.name} as {reg.address}, registered with"
                          f" {joined} of {len(reg.links)} name servers")
        for r in rec.rebuilt:
            logs.announce(cfg.log_format, f"  rebuilt   index of {r} from the log")
        for r in rec.lost:
            logs.announce(cfg.log_format, f"  LOST      {r}: no record in the log (reads of them fail; skip them)")
        try:
            await stop.wait()
        finally:
            logs.announce(cfg.log_format, "equeue broker stopping: flushing and persisting offsets")
            await broker.stop()
            logs.announce(cfg.log_format, "equeue broker stopped")

    _run_loop(main())
    return 0


def _log_recovery(broker: Any) -> None:
    """Say what opening the store did, every field of its RecoveryReport (structured in JSON logs)."""
    rec = broker.recovery
    fields = {"clean": rec.clean, "truncated_bytes": rec.truncated_bytes, "rebuilt_entries": rec.rebuilt_entries,
              "records": rec.records, "notes": list(rec.notes),
              "seconds": round(broker.metrics.recovery_seconds, 6)}
    if rec.clean:
        text = f"recovery: the last stop was clean; store opened in {fields['seconds']:.3f}s"
    else:
        text = (f"recovery after a crash: truncated {rec.truncated_bytes} bytes of torn records, rebuilt "
                f"{rec.rebuilt_entries} index entries, scanned {rec.records} records in {fields['seconds']:.3f}s")
    if rec.notes:
        text += "; " + "; ".join(rec.notes)
    logging.getLogger("equeue.broker").log(logging.INFO if rec.clean else logging.WARNING, text,
                                           extra={"recovery": fields})


def _hot_path() -> str:
    """Which record hot path this process runs: "native (crc32c sse4.2)" or "python" (record.py)."""
    from equeue_core import record

    return f"record={record.IMPLEMENTATION}"


def cmd_version(args: argparse.Namespace) -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("equeue")
    except PackageNotFoundError:
        v = "(not installed)"
    print(f"equeue {v}")
    print(f"  hot path  {_hot_path()}")
    return 0


def cmd_nameserver(args: argparse.Namespace) -> int:
    from equeue_core import config as config_mod
    from equeue_core.nameserver.server import NameServer

    cfg = config_mod.load(args.config, {"host": args.host, "port": args.port, "transport": args.transport,
                                        "nameserver_metrics_port": args.metrics_port,
                                        "controller_peers": args.controller_peers,
                                        "controller_port": args.controller_port,
                                        **_server_security_overrides(args)})
    logs.configure(cfg.log_format)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server = NameServer(cfg)
        await server.start()
        host, port = server.address
        print(f"equeue nameserver listening on {cfg.transport}://{host}:{port}", flush=True)
        print(f"  broker_expiry_s {cfg.broker_expiry_s:g} (routes live in memory only)", flush=True)
        if server.metrics_address:
            print(f"  metrics   http://{server.metrics_address[0]}:{server.metrics_address[1]}/metrics", flush=True)
        if server.controller is not None:
            print(f"  controller raft {server.controller.self_address} of {cfg.controller_peers}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()
            print("equeue nameserver stopped", flush=True)

    _run_loop(main())
    return 0


def _run_loop(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(coro)
    else:
        uvloop.run(coro)


# ---------------------------------------------------------------- produce / consume

def cmd_produce(args: argparse.Namespace) -> int:
    from equeue_core.client import Message, Producer

    sent = 0
    with Producer(args.broker, nameserver=args.nameserver) as producer:
        if args.count is not None:
            body = b"x" * args.size
            progress = ProgressReport(args.count, f"produce {args.topic}", enabled=args.progress)
            batch = max(1, min(args.batch, args.count))
            while sent < args.count:
                n = min(batch, args.count - sent)
                producer.send_batch([Message(args.topic, body, tag=args.tag) for _ in range(n)])
                sent += n
                progress.update(sent)
            progress.finish()
        else:
            progress = ProgressReport(None, f"produce {args.topic}", enabled=args.progress)
            futures = []
            for line in sys.stdin:
                futures.append(producer.send_async(Message(args.topic, line.rstrip("\n").encode(), tag=args.tag)))
                if len(futures) >= 10_000:
                    for f in futures:
                        f.result()
                    sent += len(futures)
                    futures.clear()
                    progress.update(sent)
            for f in futures:
                f.result()
            sent += len(futures)
            progress.update(sent)
            progress.finish()
    print(f"sent {sent} messages to {args.topic}", file=sys.stderr)
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    from equeue_core.client import Consumer

    done = threading.Event()
    lock = threading.Lock()
    count = 0
    # A bar only where it cannot mix with the printed messages: --quiet, or stdout redirected.
    quiet_stdout = args.quiet or not sys.stdout.isatty()
    progress = ProgressReport(args.count, f"consume {args.topic}", enabled=args.progress if quiet_stdout else False)

    def handler(m: Any) -> None:
        nonlocal count
        with lock:
            if args.count is not None and count >= args.count:
                # Not ours to take: failing it keeps it uncommitted (stop_handling below makes
                # this rare: it only happens to a call that had already started).
                raise RuntimeError("count reached")
            count += 1
            c = count
            if args.count is not None and c >= args.count:
                consumer.stop_handling()  # the rest of what was pulled stays uncommitted
        if not args.quiet:
            body = m.body.decode("utf-8", "replace")
            print(f"{m.topic}\t{m.queue_id}\t{m.queue_offset}\t{m.tag or ''}\t{body}", flush=True)
        progress.update(c)
        if args.count is not None and c >= args.count:
            done.set()

    consumer = Consumer(args.group, args.broker, consume_from=args.start, threads=1,
                        **({"nameserver": args.nameserver} if args.nameserver else {}))
    consumer.subscribe(args.topic, args.expression)
    consumer.start(handler)
    try:
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while not done.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            done.wait(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    progress.finish()
    if args.quiet:
        print(count)
    return 0 if args.count is None or count >= args.count else 2


# ---------------------------------------------------------------- admin

def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def cmd_topics(args: argparse.Namespace) -> int:
    from equeue_core.client import AdminClient

    if args.nameserver:
        from equeue_core.cli import cluster

        return cluster.topics(args)
    with AdminClient(args.broker) as admin:
        if args.action == "create":
            n = admin.create_topic(args.topic, args.queues)
            print(f"topic {args.topic}: {n} queues")
        elif args.action == "delete":
            admin.delete_topic(args.topic)
            print(f"topic {args.topic} deleted")
        else:
            topics = admin.topics(system=args.system)
            rows = [[t, info["queues"], sum(hi - lo for lo, hi in info["ranges"]),
                     " ".join(f"{lo}-{hi}" for lo, hi in info["ranges"])] for t, info in topics.items()]
            print(_table(rows, ["topic", "queues", "messages", "ranges"]))
    return 0


def cmd_groups(args: argparse.Namespace) -> int:
    from equeue_core.client import AdminClient
    from equeue_core.client.admin import reset_target

    if args.nameserver:
        from equeue_core.cli import cluster

        return cluster.groups(args)
    with AdminClient(args.broker) as admin:
        if args.action == "reset":
            for t, q, off in admin.reset_offsets(args.group, args.topic, reset_target(args.to)):
                print(f"{t}\t{q}\t{off}")
        elif args.action == "skip":
            if not (args.group and args.topic) or args.queue is None or args.offset is None:
                print("error: skip needs GROUP --topic T --queue Q --offset N", file=sys.stderr)
                return 2
            print(admin.skip_record(args.group, args.topic, args.queue, args.offset))
        elif args.action == "dlq":
            msgs = admin.dlq_messages(args.group, 0, args.count)
            for m in msgs:
                print(f"{m.msg_id}\t{m.topic}\t{m.reconsume_times}\t{m.body[:80]!r}")
            print(f"{len(msgs)} messages in the DLQ of {args.group}", file=sys.stderr)
        elif args.action == "resend":
            n = admin.resend_dlq(args.group, args.msg_ids or None)
            print(f"re-sent {n} messages")
        else:
            groups = admin.groups(args.group)
            if args.json:
                print(json.dumps(groups, indent=2))
                return 0
            for g, info in groups.items():
                print(f"group {g}: {len(info['members'])} members")
                for m in info["members"]:
                    qs = " ".join(f"{t}/{q}" for t, q in m["queues"])
                    print(f"  {m['client_id']} ({m['mode']}): {qs}")
                rows = [[r["topic"], r["queue_id"], r["committed"], r["max_offset"], r["lag"], r["owner"]]
                        for r in info["queues"]]
                if rows:
                    print(_table(rows, ["topic", "queue", "committed", "max", "lag", "owner"]))
    return 0


def cmd_message(args: argparse.Namespace) -> int:
    from equeue_core.client import AdminClient

    if args.nameserver:  # straight to the broker the id names; a key lookup asks every broker
        from equeue_core.cli import cluster

        msgs = cluster.message(args)
        if not msgs:
            print(f"no message of {args.topic} has key {args.key!r}", file=sys.stderr)
            return 1
    else:
        with AdminClient(args.broker) as admin:
            if args.key is not None:
                if not args.topic:
                    raise EQueueError("--key needs --topic")
                msgs = admin.find_by_key(args.topic, args.key, args.count)
                if not msgs:
                    print(f"no message of {args.topic} has key {args.key!r}", file=sys.stderr)
                    return 1
            elif args.msg_id:
                msgs = [admin.get_message(args.msg_id)]
            else:
                raise EQueueError("give a msg id, or --topic T --key K")
    for i, m in enumerate(msgs):
        if i:
            print()
        for field in ("msg_id", "topic", "queue_id", "queue_offset", "tag", "keys", "properties",
                      "reconsume_times", "born_ts", "store_ts"):
            print(f"{field:<16}{getattr(m, field)}")
        print(f"{'body':<16}{m.body.decode('utf-8', 'replace')}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from equeue_core.cli.stats import run_stats

    return run_stats(args.broker, args.interval, args.once, args.system, nameserver=args.nameserver)


def cmd_console(args: argparse.Namespace) -> int:
    from equeue_core.console.server import serve

    logs.configure(args.log_format)
    _run_loop(serve(args.broker, args.host, args.port, args.sample_interval, args.nameserver))
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from equeue_core.client.nameserver import NameServerClient

    if args.action == "failover":
        from equeue_core.cli.cluster import failover

        return failover(args)
    with NameServerClient(args.nameserver) as ns:
        if args.topic:
            route = ns.get_route(args.topic)
            rows = [[b.cluster, b.name, b.address, b.queues, ("r" if b.readable else "-") + ("w" if b.writable else "-"),
                     " ".join(b.replicas) or "-"] for b in route.brokers]
            print(_table(rows, ["cluster", "broker", "address", "queues", "perm", "replicas"]))
            return 0
        from equeue_core.cli.cluster import GROUP_HEADER, controller_view, group_rows, rate_cells, rates

        info = ns.cluster_info()
        controller = controller_view(ns)
        if args.json:
            print(json.dumps({**info.to_wire(), **({"controller": controller} if controller else {})}, indent=2))
            return 0
        per_s = rates(args.nameserver, args.interval) if args.interval > 0 else {}
        fronts = {(b.cluster, b.name, b.broker_id) for b in info.fronts()}
        rows = [[b.cluster, b.name, b.broker_id, b.address, b.role, b.epoch, b.topics, f"{b.heartbeat_age_s:.1f}s",
                 *(rate_cells(per_s, b.name) if (b.cluster, b.name, b.broker_id) in fronts else ["-", "-"])]
                for b in info.brokers]
        print(_table(rows, ["cluster", "broker", "id", "address", "role", "epoch", "topics", "last heartbeat",
                            "in/s", "out/s"]))
        print()
        print(_table(group_rows(info, controller), GROUP_HEADER))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from equeue_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    for hook, entries in pm.describe().items():
        print(f"{hook}:")
        for name, origin in entries:
            print(f"  {name:<22} {origin}")
    for name, why in sorted(pm.failed.items()):
        print(f"failed to load: {name}: {why}")
    return 0


def cmd_spark(args: argparse.Namespace, rest: list[str]) -> int:
    try:
        from equeue_spark.cli import main as spark_main
    except ImportError as e:
        raise EQueueError(f"the Spark jobs need the spark extra (pip install 'equeue[spark]'): {e}") from None
    return int(spark_main(rest) or 0)


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="equeue", description="EQueue for Python: a persistent message broker.")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("broker", help="run a broker in the foreground")
    b.add_argument("--config", help="TOML config file")
    b.add_argument("--data-dir")
    b.add_argument("--host")
    b.add_argument("--port", type=int)
    b.add_argument("--flush", choices=["sync", "async"])
    b.add_argument("--store", help="store plugin name (file, lmdb, rocksdb)")
    b.add_argument("--transport", help="transport plugin name (tcp, zmq)")
    b.add_argument("--log-format", choices=["text", "json"], help="log lines as text (default) or JSON")
    b.add_argument("--metrics-host", help="address of the Prometheus endpoint (default 127.0.0.1)")
    b.add_argument("--metrics-port", type=int, help="port of the Prometheus endpoint (default 10913, 0 = off)")
    b.add_argument("--nameserver", help="join a cluster: name servers host:port[,host:port...]")
    b.add_argument("--name", help="broker name in its cluster (default <hostname>-<port>)")
    b.add_argument("--cluster", help="cluster name (default DefaultCluster)")
    _server_security_arguments(b)
    b.add_argument("--controller", action="store_true",
                   help="let the name servers' controller choose master or replica (needs --nameserver)")
    b.add_argument("--role", choices=["master", "replica"], help="static replication role (default master)")
    b.add_argument("--master", help="a replica's master: host:port or tls://host:port")
    b.add_argument("--broker-id", type=int, help="this broker's id in its group (default 0)")
    b.add_argument("--replication", choices=["async", "sync"], help="answer sends after the master stored "
                   "them (async, default) or after --min-insync replicas did (sync)")
    b.add_argument("--min-insync", type=int, help="sync replication: replicas that must have a send (default 1)")
    b.set_defaults(fn=cmd_broker)

    rp = sub.add_parser("replication", help="a broker's replication role: status, promote, demote")
    rp.add_argument("action", choices=["status", "promote", "demote"])
    rp.add_argument("--broker", default="127.0.0.1:10911")
    rp.add_argument("--epoch", type=int, help="promote/demote: the epoch (promote default: the broker's + 1)")
    rp.add_argument("--master", help="demote: the new master's address")
    rp.set_defaults(fn=lambda a: __import__("equeue_core.cli.replication", fromlist=["cmd_replication"])
                    .cmd_replication(a))

    ns = sub.add_parser("nameserver", help="run a name server (route registry) in the foreground")
    ns.add_argument("--config", help="TOML config file (reads transport, broker_expiry_s, limits)")
    ns.add_argument("--host")
    ns.add_argument("--port", type=int, default=9876)
    ns.add_argument("--transport", help="transport plugin name (tcp, zmq)")
    ns.add_argument("--metrics-port", type=int,
                    help="port of the Prometheus endpoint (default 9878, 0 = off; host: metrics_host)")
    ns.add_argument("--controller-peers", help="run the controller: every name server's Raft host:port, "
                    "comma-separated, this one included (docs/controller.md)")
    ns.add_argument("--controller-port", type=int, help="this name server's Raft port (one of --controller-peers)")
    _server_security_arguments(ns)
    ns.set_defaults(fn=cmd_nameserver)

    ky = sub.add_parser("keys", help="CURVE keys for the zmq transport (docs/security.md)")
    ky.add_argument("action", choices=["generate"])
    ky.add_argument("--out", default=".", help="directory to write <name>.key and <name>.key_secret to")
    ky.add_argument("--name", default="equeue", help="file name of the pair (default equeue)")
    ky.set_defaults(fn=cmd_keys)

    cl = sub.add_parser("cluster", help="brokers and groups (master, replicas, epoch, in-sync, lag), one topic's "
                        "route, or `failover --group G --to ID`")
    cl.add_argument("action", nargs="?", choices=["failover"],
                    help="failover: move a group's mastership by hand to an in-sync member (docs/controller.md)")
    cl.add_argument("--nameserver", required=True, help="host:port[,host:port...]")
    cl.add_argument("--group", help="failover: the broker group (broker name)")
    cl.add_argument("--to", type=int, help="failover: the broker id to make master (default: the best in-sync one)")
    cl.add_argument("--cluster", help="failover: the group's cluster (needed if the name is in several)")
    cl.add_argument("--topic", help="show this topic's route (brokers and queue counts)")
    cl.add_argument("--json", action="store_true")
    cl.add_argument("--interval", type=float, default=1.0,
                    help="seconds between the two BROKER_STATS samples behind in/s and out/s (0: none)")
    cl.set_defaults(fn=cmd_cluster)

    dc = sub.add_parser("dev-cluster", help="2 name servers + 3 brokers on this machine; Ctrl-C stops all")
    dc.add_argument("--data-dir", default="data/dev-cluster", help="one folder for every broker's data and logs")
    dc.add_argument("--port", type=int, default=9876, help="first name server port (the second is +1)")
    dc.add_argument("--broker-port", type=int, default=10911, help="broker-a's port (b: +10, c: +20)")
    dc.add_argument("--cluster", default="DefaultCluster")
    dc.set_defaults(fn=lambda a: __import__("equeue_core.cli.cluster", fromlist=["dev_cluster"]).dev_cluster(a))

    pr = sub.add_parser("produce", help="send messages (--count N --size S, or lines from stdin)")
    pr.add_argument("--broker", default=DEFAULT_BROKER)
    pr.add_argument("--nameserver", help="route over a cluster: name servers host:port[,host:port...] (instead of --broker)")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--count", type=int)
    pr.add_argument("--size", type=int, default=100)
    pr.add_argument("--batch", type=int, default=1000)
    pr.add_argument("--tag")
    pr.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress on stderr (default: a bar on a terminal, a line every 5 s otherwise)")
    pr.set_defaults(fn=cmd_produce)

    c = sub.add_parser("consume", help="print (or count) messages of a topic")
    c.add_argument("--broker", default=DEFAULT_BROKER)
    c.add_argument("--nameserver", help="route over a cluster: name servers host:port[,host:port...] (instead of --broker)")
    c.add_argument("--topic", required=True)
    c.add_argument("--group", required=True)
    c.add_argument("--expression", default="*", help="'*' or 'tagA || tagB'")
    c.add_argument("--count", type=int, help="exit after N messages")
    c.add_argument("--start", choices=["first", "last"], default="first")
    c.add_argument("--timeout", type=float, help="give up after this many seconds")
    c.add_argument("--quiet", action="store_true", help="count instead of printing")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr with --quiet or redirected stdout (default: as for produce)")
    c.set_defaults(fn=cmd_consume)

    t = sub.add_parser("topics", help="list, create or delete topics")
    t.add_argument("action", choices=["list", "create", "delete"])
    t.add_argument("topic", nargs="?")
    t.add_argument("--queues", type=int)
    t.add_argument("--system", action="store_true", help="include %%RETRY%%, %%DLQ%% and schedule topics")
    t.add_argument("--brokers", help="with --nameserver: create on these brokers (names, comma-separated) only")
    t.add_argument("--cluster", help="with --nameserver: create on every broker of this cluster")
    t.add_argument("--broker", default=DEFAULT_BROKER)
    t.add_argument("--nameserver", help="route over a cluster: name servers host:port[,host:port...] (instead of --broker)")
    t.set_defaults(fn=cmd_topics)

    g = sub.add_parser("groups", help="group members, offsets and lag; reset offsets; skip a record; DLQ")
    g.add_argument("action", nargs="?", choices=["show", "reset", "dlq", "resend", "skip"], default="show")
    g.add_argument("group", nargs="?")
    g.add_argument("--topic")
    g.add_argument("--to", help="earliest, latest, epoch ms or an ISO date/time, UTC by default (reset)")
    g.add_argument("--count", type=int, default=100)
    g.add_argument("--queue", type=int, help="queue id (skip)")
    g.add_argument("--offset", type=int, help="the queue offset to skip, e.g. a corrupt record's (skip)")
    g.add_argument("--msg-ids", nargs="*")
    g.add_argument("--json", action="store_true")
    g.add_argument("--broker", default=DEFAULT_BROKER)
    g.add_argument("--nameserver", help="route over a cluster: name servers host:port[,host:port...] (instead of --broker)")
    g.set_defaults(fn=cmd_groups)

    ms = sub.add_parser("message", help="show a message by its msg id, or by key (--topic T --key K)")
    ms.add_argument("msg_id", nargs="?")
    ms.add_argument("--topic")
    ms.add_argument("--key")
    ms.add_argument("--count", type=int, default=32, help="most messages to show for a key")
    ms.add_argument("--broker", default=DEFAULT_BROKER)
    ms.add_argument("--nameserver", help="route over a cluster: name servers host:port[,host:port...] (instead of --broker)")
    ms.set_defaults(fn=cmd_message)

    st = sub.add_parser("stats", help="live view of a broker: rates per topic, lag per group, latency, disk")
    st.add_argument("--broker", default=DEFAULT_BROKER)
    st.add_argument("--nameserver", help="every broker of a cluster: name servers host:port[,host:port...] (instead of --broker)")
    st.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    st.add_argument("--once", action="store_true",
                    help="print one view (rates over one interval) and exit; the default off a terminal")
    st.add_argument("--system", action="store_true", help="include %%RETRY%%, %%DLQ%% and schedule topics")
    st.set_defaults(fn=cmd_stats)

    co = sub.add_parser("console", help="web console: topics, groups and lag, messages, DLQ re-send, resets")
    co.add_argument("--broker", default=DEFAULT_BROKER, help="the broker to show")
    co.add_argument("--nameserver", help="show a cluster: name servers host:port[,host:port...] (instead of --broker)")
    co.add_argument("--host", default="127.0.0.1", help="address the console serves on (default 127.0.0.1)")
    co.add_argument("--port", type=int, default=8080, help="port the console serves on (default 8080)")
    co.add_argument("--sample-interval", type=float, default=5.0,
                    help="seconds between the lag samples behind the charts and rates (default 5)")
    co.add_argument("--log-format", choices=["text", "json"], default="text", help="log lines as text or JSON")
    co.set_defaults(fn=cmd_console)

    pl = sub.add_parser("plugins", help="installed plugins per hook")
    pl.set_defaults(fn=cmd_plugins)

    ve = sub.add_parser("version", help="the installed version and which record hot path runs (native or python)")
    ve.set_defaults(fn=cmd_version)

    sub.add_parser("spark", help="Spark jobs: export, report (see `equeue spark --help`)", add_help=False)
    for client_cmd in (pr, c, t, g, ms, st, co, cl):
        _credential_arguments(client_cmd)
    return p


def _credential_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--access-key", help="sign requests as this ACL account (or EQUEUE_ACCESS_KEY)")
    parser.add_argument("--secret-key", help="the account's secret (or EQUEUE_SECRET_KEY; the environment "
                                             "keeps it out of the process list)")
    parser.add_argument("--tls-ca", help="tls:// brokers: verify them with this PEM CA (or EQUEUE_TLS_CA)")
    parser.add_argument("--tls-cert", help="tls:// brokers: present this client certificate (or EQUEUE_TLS_CERT)")
    parser.add_argument("--tls-key", help="the private key of --tls-cert (or EQUEUE_TLS_KEY)")
    parser.add_argument("--curve-server-key", help="zmq brokers: CURVE with this server public key, Z85 or key "
                                                   "file (or EQUEUE_CURVE_SERVER_KEY)")
    parser.add_argument("--curve-secret-key", help="this client's CURVE key file (.key_secret) (or "
                                                   "EQUEUE_CURVE_SECRET_KEY; default: a throw-away pair)")


def _server_security_arguments(parser: argparse.ArgumentParser) -> None:
    """What a broker and a name server serve with (docs/security.md); both take the same flags."""
    parser.add_argument("--acl-file", help="turn ACLs on with this TOML file of [[accounts]] (docs/security.md)")
    parser.add_argument("--tls-cert", help="serve TLS with this PEM certificate (with --tls-key)")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", help="mutual TLS: require client certificates signed by this PEM CA")
    parser.add_argument("--curve-secret-key", help="zmq transport: serve CURVE only, with this secret key file "
                                                   "(`equeue keys generate`)")
    parser.add_argument("--curve-allowed-keys", help="zmq transport with CURVE: let in only the client public "
                                                     "keys in this file or directory of .key files")


def _server_security_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {"acl_file": args.acl_file, "acl": True if args.acl_file else None,
            "tls_server_cert": args.tls_cert, "tls_server_key": args.tls_key, "tls_client_ca": args.tls_ca,
            "zmq_curve_secret_key_file": args.curve_secret_key, "zmq_curve_allowed_keys": args.curve_allowed_keys}


def cmd_keys(args: argparse.Namespace) -> int:
    from equeue_core import curve_keys

    public, secret = curve_keys.generate(args.out, args.name)
    print(f"wrote {public} (public: share it) and {secret} (secret, mode 0600: keep it here)")
    print(f"public key {curve_keys.read_key_file(public)[0]}")
    return 0


def _export_credentials(args: argparse.Namespace) -> None:
    """--access-key/--secret-key reach every client this command makes (they read the environment)."""
    if getattr(args, "access_key", None):
        os.environ["EQUEUE_ACCESS_KEY"] = args.access_key
    if getattr(args, "secret_key", None):
        os.environ["EQUEUE_SECRET_KEY"] = args.secret_key
    for name in ("tls_ca", "tls_cert", "tls_key", "curve_server_key", "curve_secret_key"):
        if getattr(args, name, None) and args.command not in ("broker", "nameserver"):
            os.environ["EQUEUE_" + name.upper()] = getattr(args, name)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spark"]:
        try:
            return cmd_spark(argparse.Namespace(), argv[1:])
        except EQueueError as e:
            print(f"equeue: {e}", file=sys.stderr)
            return 1
    parser = build_parser()
    args = parser.parse_args(argv)
    for needed, actions in (("topic", ("create", "delete")),):
        if getattr(args, "action", None) in actions and not getattr(args, needed, None):
            parser.error(f"{args.command} {args.action} needs a {needed}")
    if args.command == "groups" and args.action in ("reset", "dlq", "resend") and not args.group:
        parser.error(f"groups {args.action} needs a group")
    if args.command == "groups" and args.action == "reset" and not (args.topic and args.to):
        parser.error("groups reset needs --topic and --to")
    _export_credentials(args)
    try:
        return int(args.fn(args) or 0)
    except EQueueError as e:
        print(f"equeue: {e}", file=sys.stderr)
        return 1
    except ConnectionRefusedError as e:
        print(f"equeue: cannot connect: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
