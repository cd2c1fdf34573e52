"""The CLI over a cluster: `--nameserver` on topics, groups and message, `equeue cluster` with
rates, and `equeue dev-cluster` (2 name servers + 3 brokers on this machine).

Every answer is per broker: queue ids, offsets and lag belong to the broker that owns the queue.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from equeue_core.errors import EQueueError


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _per_broker(answers: dict[str, Any]) -> dict[str, Any]:
    """Answers of the brokers that answered; one stderr line for each that did not."""
    ok = {}
    for broker, r in answers.items():
        if isinstance(r, BaseException):
            print(f"equeue: broker {broker}: {r}", file=sys.stderr)
        else:
            ok[broker] = r
    return ok


def topics(args: argparse.Namespace) -> int:
    from equeue_core.client import AdminClient

    with AdminClient(nameserver=args.nameserver) as admin:
        if args.action == "create":
            brokers = [b for b in (args.brokers or "").split(",") if b] or None
            created = _per_broker(admin.create_topic(args.topic, args.queues, brokers, args.cluster))
            for broker, n in sorted(created.items()):
                print(f"topic {args.topic}: {n} queues on {broker}")
            return 0 if created else 1
        if args.action == "delete":
            for broker in sorted(_per_broker(admin.delete_topic(args.topic))):
                print(f"topic {args.topic} deleted on {broker}")
            return 0
        rows = []
        for broker, ts in sorted(_per_broker(admin.topics(system=args.system)).items()):
            for t, info in ts.items():
                rows.append([t, broker, info["queues"], sum(hi - lo for lo, hi in info["ranges"]),
                             " ".join(f"{lo}-{hi}" for lo, hi in info["ranges"])])
        rows.sort()
        print(_table(rows, ["topic", "broker", "queues", "messages", "ranges"]))
    return 0


def groups(args: argparse.Namespace) -> int:
    from equeue_core.client import AdminClient
    from equeue_core.client.admin import reset_target

    with AdminClient(nameserver=args.nameserver) as admin:
        if args.action == "reset":
            for broker, offsets in sorted(_per_broker(admin.reset_offsets(args.group, args.topic,
                                                                          reset_target(args.to))).items()):
                for t, q, off in offsets:
                    print(f"{broker}\t{t}\t{q}\t{off}")
            return 0
        if args.action != "show":
            raise EQueueError(f"groups {args.action} works on one broker: give --broker (the broker that holds it)")
        answers = _per_broker(admin.groups(args.group))
        if args.json:
            print(json.dumps(answers, indent=2))
            return 0
        names = sorted({g for gs in answers.values() for g in gs if args.group or not g.startswith("%")})
        for g in names:
            members = {m["client_id"] for gs in answers.values() for m in gs.get(g, {}).get("members", [])}
            print(f"group {g}: {len(members)} members")
            rows = [[r["topic"], broker, r["queue_id"], r["committed"], r["max_offset"], r["lag"], r["owner"]]
                    for broker, gs in sorted(answers.items()) for r in gs.get(g, {}).get("queues", [])]
            lag = sum(r[5] or 0 for r in rows)
            if rows:
                print(_table(rows, ["topic", "broker", "queue", "committed", "max", "lag", "owner"]))
            print(f"total lag {lag}")
    return 0


def message(args: argparse.Namespace) -> list[Any]:
    from equeue_core.client import AdminClient

    with AdminClient(nameserver=args.nameserver) as admin:
        if args.key is not None:
            if not args.topic:
                raise EQueueError("--key needs --topic")
            return admin.find_by_key(args.topic, args.key, args.count)
        if args.msg_id:
            return [admin.get_message(args.msg_id)]
        raise EQueueError("give a msg id, or --topic T --key K")


def rates(nameserver: str, interval: float) -> dict[str, tuple[float, float]]:
    """Messages in and out per second per broker, from two BROKER_STATS snapshots `interval` apart."""
    from equeue_core.client import AdminClient

    def totals(snaps: dict[str, Any]) -> dict[str, tuple[float, int, int]]:
        return {b: (s["time"], sum(t["messages_in"] for t in s["topics"].values()),
                    sum(t["messages_out"] for t in s["topics"].values())) for b, s in snaps.items()}

    with AdminClient(nameserver=nameserver) as admin:
        first = totals(_per_broker(admin.stats()))
        time.sleep(interval)
        second = totals(_per_broker(admin.stats()))
    out = {}
    for b, (t1, i1, o1) in second.items():
        if b in first:
            t0, i0, o0 = first[b]
            dt = max(t1 - t0, 1e-6)
            out[b] = ((i1 - i0) / dt, (o1 - o0) / dt)
    return out


def rate_cells(per_s: dict[str, tuple[float, float]], broker: str) -> list[str]:
    """The in/s and out/s cells of a broker ("-" when it did not answer both samples)."""
    r = per_s.get(broker)
    return ["-", "-"] if r is None else [f"{r[0]:,.0f}", f"{r[1]:,.0f}"]


# ---------------------------------------------------------------- dev-cluster

def dev_cluster(args: argparse.Namespace) -> int:
    """2 name servers and 3 brokers under one folder; prints their addresses; SIGINT/SIGTERM stops all."""
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    ns_ports = [args.port, args.port + 1]
    nameserver = ",".join(f"127.0.0.1:{p}" for p in ns_ports)
    procs: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    exe = [sys.executable, "-m", "equeue_core.cli.main"]

    def launch(what: str, cmd: list[str]) -> bool:
        log = open(base / f"{what}.log", "ab")
        p = subprocess.Popen(exe + cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        procs.append((what, p))
        assert p.stdout is not None
        for line in p.stdout:  # wait for "listening on"
            if b"listening on" in line:
                print(f"{what:<12} {line.decode().split('listening on', 1)[1].strip()}", flush=True)
                return True
            if stopping:
                break
        return False

    ok = True
    try:
        for i, port in enumerate(ns_ports):
            ok = ok and not stopping and launch(f"nameserver-{i + 1}", ["nameserver", "--host", "127.0.0.1",
                                                                         "--port", str(port), "--metrics-port", "0"])
        for i, name in enumerate(("broker-a", "broker-b", "broker-c")):
            port = args.broker_port + 10 * i
            ok = ok and not stopping and launch(name, [
                "broker", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(base / name),
                "--nameserver", nameserver, "--name", name, "--cluster", args.cluster, "--metrics-port", "0"])
        if ok and not stopping:
            print(f"cluster {args.cluster} up; data and logs in {base}; clients: --nameserver {nameserver}; "
                  "Ctrl-C stops all", flush=True)
            while not stopping and all(p.poll() is None for _, p in procs):
                time.sleep(0.2)
            for what, p in procs:
                if p.poll() is not None and not stopping:
                    print(f"equeue: {what} exited ({p.returncode}); see {base / (what + '.log')}", file=sys.stderr)
    finally:
        for _what, p in reversed(procs):  # brokers first: they unregister from the name servers
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for what, p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
            if p.stdout:
                p.stdout.close()
            print(f"{what:<12} stopped", flush=True)
    return 0 if ok else 1


def controller_view(ns: Any) -> dict[str, Any] | None:
    """The controller's view (CONTROLLER_INFO) or None when the name servers run no controller."""
    from equeue_core.errors import NoControllerError, UnknownRequestError

    try:
        return ns.controller_info()
    except (NoControllerError, UnknownRequestError):  # UnknownRequestError: a name server older than codes 60-62
        return None


def group_rows(info: Any, controller: dict[str, Any] | None) -> list[list[Any]]:
    """One row per broker group: master, replicas, epoch, in-sync set and each replica's lag in
    bytes. From the controller when it runs; otherwise from what the brokers registered (no
    in-sync set or lag then: "-")."""
    rows: list[list[Any]] = []
    if controller is not None:
        for g in controller["groups"]:
            master = g["master_id"]
            replicas = [int(i) for i in g["members"] if master is None or int(i) != master]
            lag = g.get("lag_bytes") or {}
            rows.append([g["cluster"], g["name"], "none" if master is None else f"{master} {g['master_address']}",
                         " ".join(f"{i} {g['members'][str(i)]}" for i in replicas) or "-", g["epoch"],
                         " ".join(str(i) for i in g["in_sync"]) or "-",
                         " ".join(f"{i}:{lag[str(i)]}" for i in replicas if str(i) in lag) or "-"])
        return rows
    groups: dict[tuple[str, str], list[Any]] = {}
    for b in info.brokers:
        groups.setdefault((b.cluster, b.name), []).append(b)
    for (cluster, name), members in sorted(groups.items()):
        masters = [b for b in members if b.role == "master"]
        master = max(masters, key=lambda b: b.epoch) if masters else None
        rows.append([cluster, name, "none" if master is None else f"{master.broker_id} {master.address}",
                     " ".join(f"{b.broker_id} {b.address}" for b in members if b is not master) or "-",
                     max(b.epoch for b in members), "-", "-"])
    return rows


GROUP_HEADER = ["cluster", "group", "master", "replicas", "epoch", "in-sync", "lag bytes"]


def failover(args: argparse.Namespace) -> int:
    """`equeue cluster failover --group NAME --to ID`: move mastership by hand (to an in-sync member only)."""
    from equeue_core.client.nameserver import NameServerClient

    if not args.group:
        raise EQueueError("equeue cluster failover needs --group (and --to <broker-id>)")
    with NameServerClient(args.nameserver) as ns:
        cluster = args.cluster
        if cluster is None:
            clusters = sorted({g["cluster"] for g in ns.controller_info()["groups"] if g["name"] == args.group})
            if len(clusters) != 1:
                raise EQueueError(f"group {args.group!r} is in {len(clusters)} clusters ({', '.join(clusters) or 'none'}): "
                                  "name one with --cluster")
            cluster = clusters[0]
        r = ns.elect_master(cluster, args.group, args.to)
    if not r.get("changed", True):
        print(f"group {cluster}/{args.group}: broker {r['master_id']} is master already (epoch {r['epoch']})")
    else:
        print(f"group {cluster}/{args.group}: broker {r['master_id']} ({r['master_address']}) is master "
              f"at epoch {r['epoch']}")
    return 0
