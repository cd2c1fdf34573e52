"""The peers benchmark: the same workloads against EQueue and the brokers people pick instead,
each server started here on free loopback ports in a tmp dir and always stopped, one JSON line
per (system, workload, size), then one table of ratios (>1 means EQueue is ahead).

    .venv/bin/python -m bench.peers            # all systems, a few minutes on 2 cores
    .venv/bin/python -m bench.peers --quick    # ~1 minute
    .venv/bin/python -m bench.peers --systems equeue,redis_streams --count 20000

Workloads (durability on everywhere):
- produce: 100 B and 1 KiB bodies, each system's best batching pattern (and EQueue's send_async);
- consume: drain the 100 B and 1 KiB backlogs the batch produce left, at the client's default settings;
- latency: a steady paced rate (default 5k msg/s), p50/p99 from each message's stamp and (due_*)
  from its slot in the pace, the receiver in its own process; `sleep` between sends, and `spin`
  where the sender's thread stays busy between sends;
- single: one send at a time, each waiting for its acknowledgement.
Produce and single-send runs stop early after --budget seconds (a slow peer bounds the run's time;
each row gives the count it reached). A latency row's achieved_rate shows whether its sender kept
the pace; the table marks those that did not.
Under the ratio table: each system's server CPU a message, its clients' CPU a message in the
latency rows (sender / receiver), and its slow messages.
A peer whose server binary or Python client is missing prints a `skipped` row with the reason.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.common import EPISODE_GAP_MS, SLOW_MS, emit, run_latency, run_role, tree_cpu_seconds

DRIVERS = ["equeue", "redis_streams", "nats_jetstream", "rabbitmq", "loopback_floor"]
REFERENCE = "equeue"
# Systems that are bounds of this machine, not peers: no column in the ratio table, a section of
# their own under it (print_bounds).
FLOOR = "loopback-floor"
BOUND_PEER = "redis-streams"  # the peer the single-send target names


def _ratio_specs() -> list[tuple[str, tuple, tuple, bool]]:
    """(label, EQueue row key, peer row key, lower_is_better). A key is
    (workload, mode, size, flush); the peers' key has flush None and mode "batch" for produce."""
    specs: list[tuple[str, tuple, tuple, bool]] = []
    for size, label in ((100, "100 B"), (1024, "1 KiB")):
        specs.append((f"produce {label}: send_batch / peer batch", ("produce", "batch", size, "async"),
                      ("produce", "batch", size, None), False))
        specs.append((f"produce {label}: send_async / peer batch", ("produce", "async", size, "async"),
                      ("produce", "batch", size, None), False))
    for size, label in ((100, "100 B"), (1024, "1 KiB")):
        specs.append((f"produce {label}: send_batch flush=sync / peer batch", ("produce", "batch", size, "sync"),
                      ("produce", "batch", size, None), False))
    for size, label in ((100, "100 B"), (1024, "1 KiB")):
        specs.append((f"consume {label}, default settings", ("consume", "drain", size, "async"),
                      ("consume", "drain", size, None), False))
    specs.append(("single send 100 B: send / peer single", ("single", "sync-each", 100, "async"),
                  ("single", "sync-each", 100, None), False))
    specs.append(("single send 100 B: send flush=sync / peer single", ("single", "sync-each", 100, "sync"),
                  ("single", "sync-each", 100, None), False))
    for mode in ("sleep", "spin"):
        for stat in ("p50_ms", "p99_ms"):
            specs.append((f"latency {stat[:3]} paced, sender {mode}s (peer / EQueue)",
                          ("latency", mode, 100, "async", stat), ("latency", mode, 100, None, stat), True))
    for stat in ("p50_ms", "p99_ms"):  # EQueue's send_async sender against the peers' sleeping one
        specs.append((f"latency {stat[:3]} paced, sender sleeps, EQueue send_async (peer / EQueue)",
                      ("latency", "sleep-send_async", 100, "async", stat), ("latency", "sleep", 100, None, stat), True))
    for stat in ("p50_ms", "p99_ms"):  # EQueue's push Consumer (a handler) as the receiver
        specs.append((f"latency {stat[:3]} paced, sender sleeps, EQueue push Consumer (peer / EQueue)",
                      ("latency", "sleep-push", 100, "async", stat), ("latency", "sleep", 100, None, stat), True))
    for stat in ("p50_ms", "p99_ms"):  # the same, its handler threads pulling for themselves
        specs.append((f"latency {stat[:3]} paced, sender sleeps, EQueue push Consumer, handler threads pull "
                      "(peer / EQueue)", ("latency", "sleep-push_pulling", 100, "async", stat),
                      ("latency", "sleep", 100, None, stat), True))
    # Each p99 again from the messages' slots in the pace (common.STAMP_BYTES): a sender that waits
    # for each answer and one that does not are then measured alike
    for label, our_key, peer_key, lower_better in list(specs):
        if our_key[-1] == "p99_ms":
            specs.append((label.replace("latency p99 paced", "latency p99 from the slot, paced"),
                          (*our_key[:4], "due_p99_ms"), (*peer_key[:4], "due_p99_ms"), lower_better))
    return specs


def server_cpu(before: float | None, after: float | None, row: dict) -> dict:
    """The server's CPU during a row (`server_cpu_s`, its process tree from the role's start to its
    end: client start-up, warm-up and idle time included) and per message of the row
    (`server_cpu_us_per_msg`): what each system's server pays for a message, the figure that says
    why one is faster than another and that moves less than a rate with the machine's load. Empty
    when the server's pid is unknown or it was gone."""
    messages = row.get("sent") or row.get("count")
    if before is None or after is None or not messages:
        return {}
    return {"server_cpu_s": round(after - before, 6),
            "server_cpu_us_per_msg": round((after - before) * 1e6 / messages, 2)}


def behind_pace(row: dict | None) -> bool:
    """A latency row whose sender could not keep the asked rate (a starved or slow client): its
    latencies include the queueing that caused, so the table marks it."""
    return bool(row and row.get("achieved_rate") and row["achieved_rate"] < 0.9 * row["rate"])


def _key(row: dict) -> tuple:
    return (row["workload"], row["mode"], row["size"], row.get("flush"))


Table = list[tuple[str, float | None, dict[str, float | None], dict[str, bool]]]


def ratios(rows: list[dict]) -> tuple[list[str], Table]:
    """Per label: EQueue's own figure, and per peer system EQueue / peer for throughput, peer /
    EQueue for latency (so >1 means EQueue is ahead); None where either side has no figure."""
    ours = {_key(r): r for r in rows if r.get("system") == REFERENCE and "error" not in r}
    peers: list[str] = []
    theirs: dict[str, dict[tuple, dict]] = {}
    for r in rows:
        if r.get("system") in (None, REFERENCE, FLOOR) or r.get("bench") != "peers":
            continue
        if r["system"] not in peers:
            peers.append(r["system"])
        if "workload" in r and "error" not in r:
            theirs.setdefault(r["system"], {})[_key(r)] = r
    table = []
    for label, our_key, peer_key, lower_better in _ratio_specs():
        stat = our_key[4] if len(our_key) > 4 else "msgs_per_s"
        o = ours.get(our_key[:4])
        cells: dict[str, float | None] = {}
        flags = {REFERENCE: behind_pace(o)}
        for peer in peers:
            t = theirs.get(peer, {}).get(peer_key[:4])
            flags[peer] = behind_pace(t)
            a = o.get(stat) if o else None
            b = t.get(stat) if t else None
            if not a or not b:
                cells[peer] = None
            else:
                cells[peer] = round(b / a if lower_better else a / b, 2)
        table.append((label, o.get(stat) if o else None, cells, flags))
    return peers, table


def print_table(peers: list[str], table: Table, rows: list[dict]) -> None:
    skipped = {r["system"]: r["skipped"] for r in rows if "skipped" in r}
    print()
    print("| " + " | ".join(["EQueue vs peer (>1: EQueue ahead)", "EQueue", *peers]) + " |")
    print("|---|---:|" + "---:|" * len(peers))
    for label, ours, cells, flags in table:
        vals = []
        for p in peers:
            v = cells.get(p)
            vals.append("skipped" if p in skipped else ("n/a" if v is None else f"{v:.2f}" + "*" * flags[p]))
        mine = "n/a" if ours is None else (f"{ours:.2f} ms" if "latency" in label else f"{ours / 1000:.1f}k/s")
        mine += "*" * flags[REFERENCE]
        print("| " + " | ".join([label, mine, *vals]) + " |")
    if any(any(flags.values()) for *_, flags in table):
        print("* that system's paced sender fell below 90 % of the asked rate (see achieved_rate)")
    for system, reason in skipped.items():
        print(f"skipped {system}: {reason}")
    sys.stdout.flush()


def side_table(rows: list[dict], value: Callable[[dict], Any], bench: str, latency_only: bool = False) -> list[dict]:
    """Per comparison of the ratio table (a latency comparison once, not per statistic; only
    those with `latency_only`), `value` of EQueue's row and of each peer's (None: the row has
    none): rows `"bench": bench`."""
    by_system: dict[str, dict[tuple, Any]] = {}  # in the order the systems ran (the ratio table's)
    for r in rows:
        if r.get("bench") == "peers" and r.get("system") != FLOOR and (v := value(r)) is not None:
            by_system.setdefault(r["system"], {})[_key(r)] = v
    ours = by_system.get(REFERENCE, {})
    out, seen = [], set()
    for label, our_key, peer_key, _ in _ratio_specs():
        if len(our_key) > 4 and our_key[4] != "p50_ms":
            continue  # one line per latency row pair
        if latency_only and len(our_key) <= 4:
            continue
        if (our_key[:4], peer_key[:4]) in seen:
            continue
        seen.add((our_key[:4], peer_key[:4]))
        label = label.replace("latency p50 paced", "latency paced").replace(" (peer / EQueue)", "")
        out.append({"bench": bench, "workload": label, REFERENCE: ours.get(our_key[:4]),
                    **{s: v.get(peer_key[:4]) for s, v in by_system.items() if s != REFERENCE}})
    return out


def server_cpu_table(rows: list[dict]) -> list[dict]:
    """The server CPU per message of each system's row: `"bench": "peers-server-cpu"`."""
    return side_table(rows, lambda r: r.get("server_cpu_us_per_msg"), "peers-server-cpu")


def slow_table(rows: list[dict]) -> list[dict]:
    """Per latency comparison, each system's slow messages and the episodes they came in
    (common.Latencies): `"bench": "peers-slow"`, cells [over_1ms, slow_episodes]."""
    return side_table(rows, lambda r: [r["over_1ms"], r["slow_episodes"]] if "over_1ms" in r else None,
                      "peers-slow", latency_only=True)


def client_cpu_table(rows: list[dict]) -> list[dict]:
    """Per latency comparison, each system's client CPU a message: `"bench": "peers-client-cpu"`,
    cells [sender, receiver] in µs (common.sender_row, common.Latencies; a spinning sender's
    None). What a user's processes pay beside the server's CPU."""
    return side_table(rows, lambda r: [r.get("sender_cpu_us_per_msg"), r.get("receiver_cpu_us_per_msg")]
                      if r.get("workload") == "latency" else None, "peers-client-cpu", latency_only=True)


def print_side_table(found: list[dict], title: str, cell: Callable[[Any], str]) -> None:
    systems = [k for k in (found[0] if found else {}) if k not in ("bench", "workload", REFERENCE)]
    if not found or all(row.get(REFERENCE) is None for row in found):
        return
    print()
    print(title)
    print()
    print("| " + " | ".join(["workload", "EQueue", *systems]) + " |")
    print("|---|---:|" + "---:|" * len(systems))
    for row in found:
        cells = ["n/a" if row.get(s) is None else cell(row[s]) for s in (REFERENCE, *systems)]
        print("| " + " | ".join([row["workload"], *cells]) + " |")
    sys.stdout.flush()


def print_server_cpu(found: list[dict]) -> None:
    print_side_table(found, "Server CPU per message, microseconds (the server's processes during the row, "
                     "start-up and idle time included; lower is cheaper)", lambda v: f"{v:.1f}")


def print_client_cpu(found: list[dict]) -> None:
    def cell(v: list) -> str:
        return " / ".join("n/a" if x is None else f"{x:.1f}" for x in v)

    print_side_table(found, "Client CPU per message at the paced rate, microseconds: the sender's process "
                     "/ the receiver's (all their threads; a spinning sender's is its whole slot: n/a)", cell)


def print_slow(found: list[dict]) -> None:
    print_side_table(found, f"Messages over {SLOW_MS:g} ms from the stamp / the episodes they came in "
                     f"(slow messages stamped within {EPISODE_GAP_MS:g} ms of each other: few episodes "
                     "for many messages are stalls)", lambda v: f"{v[0]} / {v[1]}")


def bounds(rows: list[dict]) -> list[dict]:
    """Per flush mode, the loopback floor's single sends against Redis's and EQueue's: how far
    this machine lets a Python broker and client go (bench/peers/loopback_floor.py). Empty when
    the floor did not run."""
    single = {(r["system"], r.get("flush")): r.get("msgs_per_s") for r in rows
              if r.get("bench") == "peers" and r.get("workload") == "single" and "error" not in r}
    out = []
    for flush in ("async", "sync"):
        floor = single.get((FLOOR, flush))
        if not floor:
            continue
        ours = single.get((REFERENCE, flush))
        peer = single.get((BOUND_PEER, None))
        out.append({"bench": "peers-bound", "workload": f"single send 100 B, flush={flush}",
                    "floor_msgs_per_s": floor, "equeue_msgs_per_s": ours,
                    f"{BOUND_PEER}_msgs_per_s": peer,
                    f"floor_vs_{BOUND_PEER}": round(floor / peer, 2) if peer else None,
                    "equeue_vs_floor": round(ours / floor, 2) if ours else None})
    return out


def print_bounds(found: list[dict]) -> None:
    if not found:
        return
    print()
    print(f"Bounds of this machine: {FLOOR}, a request and its answer over loopback with no broker work "
          "(a Python client waiting as Producer.send does, a bare uvloop server; flush=sync: one fdatasync "
          "per request)")
    print()
    print(f"| single send 100 B | floor | floor / {BOUND_PEER} (the most EQueue / {BOUND_PEER} can be) "
          "| EQueue / floor |")
    print("|---|---:|---:|---:|")
    for b in found:
        ceiling = b[f"floor_vs_{BOUND_PEER}"]
        share = b["equeue_vs_floor"]
        print(f"| {b['workload'].split(', ')[1]} | {b['floor_msgs_per_s'] / 1000:.1f}k/s | "
              f"{'n/a' if ceiling is None else f'{ceiling:.2f}'} | {'n/a' if share is None else f'{share:.2f}'} |")
    sys.stdout.flush()


def run_system(driver: str, mod, system: str, info: dict, opts: dict, args: argparse.Namespace,
               rows: list[dict]) -> None:
    flush = opts.get("flush")
    base = {"bench": "peers", "system": system, "durability": mod.durability(system, opts)}
    if flush:
        base["flush"] = flush
    only_throughput = bool(flush and flush != "async")

    def record(extra: dict, fn, *fn_args) -> dict | None:
        row = {**base, **extra}
        cpu = tree_cpu_seconds(info.get("server_pid"))
        try:
            row.update(fn(*fn_args))
        except Exception as e:  # a failed workload is a row with its error, and the run goes on
            row["error"] = str(e).strip().splitlines()[-1][:300] if str(e).strip() else repr(e)
        else:
            row.update(server_cpu(cpu, tree_cpu_seconds(info.get("server_pid")), row))
        rows.append(row)
        emit(row)
        return row if "error" not in row else None

    common = {"info": info, "system": system}
    workloads = getattr(mod, "WORKLOADS", ("produce", "consume", "latency", "single"))
    produced: dict[int, tuple[str, int]] = {}
    for size in args.sizes:
        for mode in mod.PRODUCE_MODES:
            name = f"p{size}{mode}{flush or ''}"
            ok = record({"workload": "produce", "mode": mode, "size": size},
                        run_role, driver, "produce", {**common, "name": name, "size": size,
                                                      "count": args.count, "mode": mode, "budget": args.budget})
            if ok and size not in produced:
                produced[size] = (name, ok["count"])
    if only_throughput and "single" in workloads:
        single = min(args.single_count, args.sync_single_count)
        record({"workload": "single", "mode": "sync-each", "size": 100},
               run_role, driver, "single", {**common, "name": "single", "size": 100, "count": single,
                                            "budget": args.budget})
    if only_throughput:
        return
    for size, (name, count) in produced.items():
        record({"workload": "consume", "mode": "drain", "size": size},
               run_role, driver, "consume", {**common, "name": name, "count": count})
    n = int(args.rate * args.latency_seconds)
    for mode in ("sleep", "spin") if "latency" in workloads else ():
        record({"workload": "latency", "mode": mode, "size": 100, "rate": args.rate},
               run_latency, driver, {**common, "name": f"lat{mode}", "size": 100, "count": n,
                                     "rate": args.rate, "seconds": args.latency_seconds, "spin": mode == "spin"})
    for mode, spin, call in getattr(mod, "EXTRA_LATENCY_MODES", ()) if "latency" in workloads else ():
        record({"workload": "latency", "mode": mode, "size": 100, "rate": args.rate},
               run_latency, driver, {**common, "name": f"lat{mode.replace('-', '')}", "size": 100, "count": n,
                                     "rate": args.rate, "seconds": args.latency_seconds, "spin": spin,
                                     "call": call})
    if "single" in workloads:
        record({"workload": "single", "mode": "sync-each", "size": 100},
               run_role, driver, "single", {**common, "name": "single", "size": 100, "count": args.single_count,
                                            "budget": args.budget})


def run(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    wanted = args.systems.split(",") if args.systems else DRIVERS
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="equeue-peers-"))
    try:
        for driver in DRIVERS:
            mod = importlib.import_module(f"bench.peers.{driver}")
            systems = [s for s in mod.SYSTEMS if driver in wanted or s in wanted]
            if not systems:
                continue
            reason = mod.missing()
            if reason:
                for system in systems:
                    row = {"bench": "peers", "system": system, "skipped": reason}
                    rows.append(row)
                    emit(row)
                continue
            for opts in mod.SERVER_VARIANTS:
                d = tmp / f"{driver}-{len(rows)}"
                d.mkdir()
                try:
                    with mod.server(d, **opts) as info:
                        for system in systems:
                            run_system(driver, mod, system, info, opts, args, rows)
                except Exception as e:  # the server did not start (or stop): say so, go on
                    for system in systems:
                        row = {"bench": "peers", "system": system, **opts,
                               "error": f"server: {str(e).strip()[-300:]}"}
                        rows.append(row)
                        emit(row)
                finally:
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peers, table = ratios(rows)
    for label, ours, cells, _ in table:
        emit({"bench": "peers-ratio", "workload": label, "equeue": ours, **cells})
    print_table(peers, table, rows)
    cpu = server_cpu_table(rows)
    for row in cpu:
        emit(row)
    print_server_cpu(cpu)
    clients = client_cpu_table(rows)
    for row in clients:
        emit(row)
    print_client_cpu(clients)
    slow = slow_table(rows)
    for row in slow:
        emit(row)
    print_slow(slow)
    found = bounds(rows)
    for bound in found:
        emit(bound)
    print_bounds(found)
    print(f"# peers benchmark took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller counts and shorter latency runs (~1 minute)")
    p.add_argument("--systems", help=f"comma list of drivers or systems (default all: {','.join(DRIVERS)})")
    p.add_argument("--count", type=int, help="messages per produce run (default 100000, --quick 20000)")
    p.add_argument("--single-count", type=int, help="sends one by one (default 10000, --quick 500)")
    p.add_argument("--sync-single-count", type=int, default=500, help="cap of single sends with flush=sync")
    p.add_argument("--latency-seconds", type=float, help="seconds of paced sending (default 5, --quick 2)")
    p.add_argument("--budget", type=float, help="seconds a produce or single-send run may take before it stops "
                   "early and reports the count it reached (default 8, --quick 2)")
    p.add_argument("--rate", type=int, default=5000, help="paced messages per second for latency")
    p.add_argument("--sizes", default="100,1024", help="produce body sizes in bytes")
    a = p.parse_args(argv)
    a.count = a.count or (20_000 if a.quick else 100_000)
    a.single_count = a.single_count or (500 if a.quick else 10_000)
    a.latency_seconds = a.latency_seconds or (2.0 if a.quick else 5.0)
    a.budget = a.budget or (2.0 if a.quick else 8.0)
    a.sizes = [int(s) for s in a.sizes.split(",")]
    return a


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through every server's finally: nothing is left running


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    rows = run(parse_args(argv))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
