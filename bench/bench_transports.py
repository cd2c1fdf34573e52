"""Transport benchmark: every installed transport side by side, in one run, on this machine.

    .venv/bin/python -m bench.bench_transports [--duration 3] [--clients 1,8] [--transports tcp,zmq]

For each transport the server runs in its own process (uvloop, a trivial handler), and each client
is its own process with one connection. Workloads:

- `small_rr`:  request/response round trips with a 100-byte body and a small header, `depth`
  requests in flight per client (depth 1 is the latency case, depth 32 the pipelined case).
- `bulk_64k`:  64 KiB request bodies answered with a header-only ack, 8 in flight per client
  (what a producer sending batches looks like); reported as MiB/s of body moved.

`tls` runs with throw-away certificates made for the run (tests/helpers/certs.py: a CA, a server
certificate for 127.0.0.1; the clients verify it, no client certificate), so its rows are what TLS
costs over `tcp`.

One JSON line per result (ops/s, MiB/s, p50/p99 latency in ms, and CPU microseconds per request
for the server process and the clients: on a shared, loaded machine the CPU figures move far less
than the wall-clock ones), then one line per workload with the ratio of each transport to tcp
measured in this same run. Benchmarks are not tests: nothing
here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any

ECHO = 1
ACK = 2
SMALL_BODY = 100
BULK_BODY = 64 * 1024


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


# ------------------------------------------------------------------ server process


class BenchHandler:
    async def handle(self, conn: Any, frame: Any) -> Any:
        if frame.code == ACK:
            return frame.response({"n": len(frame.body)})
        return frame.response(frame.header, frame.body)

    def connection_lost(self, conn: Any) -> None:
        pass


def _cpu_seconds() -> float:
    """User + system CPU of this process, all threads (ZeroMQ's I/O threads included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def settings_for(name: str, certs_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The TransportSettings fields (server's, client's) a transport needs to run at all: `tls`
    serves a certificate made in `certs_dir`, which the clients verify."""
    if name != "tls":
        return {}, {}
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:  # tests/helpers, when run from another directory
        sys.path.insert(0, root)
    from tests.helpers.certs import make_certs

    certs = make_certs(certs_dir)
    return ({"tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key)},
            {"tls_ca": str(certs.ca)})


def server_main(name: str, settings: dict[str, str], ready: Any, stop: Any, control: Any, answers: Any) -> None:
    from equeue_core.contracts import TransportSettings
    from equeue_core.plugins import get_plugin_manager

    def report_cpu() -> None:  # the driver asks for the server's CPU around each case
        while control.get() is not None:
            answers.put(_cpu_seconds())

    threading.Thread(target=report_cpu, daemon=True).start()

    async def main() -> None:
        transport = get_plugin_manager().transport(name)
        server = await transport.serve("127.0.0.1", 0, BenchHandler(), TransportSettings(**settings))
        ready.put(server.address[1])
        await asyncio.to_thread(stop.wait, 600)
        await server.close()

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(main())


# ------------------------------------------------------------------ client process


def client_main(name: str, settings: dict[str, str], port: int, workload: str, depth: int, duration: float,
                ready: Any, go: Any, results: Any) -> None:
    from equeue_core.contracts import TransportSettings
    from equeue_core.frame import Frame
    from equeue_core.plugins import get_plugin_manager

    async def main() -> dict:
        transport = get_plugin_manager().transport(name)
        conn = await transport.connect("127.0.0.1", port, TransportSettings(**settings))
        if workload == "small_rr":
            code, body, header = ECHO, os.urandom(SMALL_BODY), {"topic": "bench", "queue": 1}
        else:
            code, body, header = ACK, os.urandom(BULK_BODY), {"topic": "bench"}
        for _ in range(200):  # warm up
            await conn.request(Frame(code, header=header, body=body), 10)
        ready.put(os.getpid())
        await asyncio.to_thread(go.wait, 60)
        cpu0 = _cpu_seconds()
        latencies: list[float] = []
        count = 0
        end = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal count
            clock = time.perf_counter
            while True:
                t0 = clock()
                if t0 >= end:
                    return
                reply = await conn.request(Frame(code, header=header, body=body), 10)
                if reply.is_error:
                    raise RuntimeError(reply.header)
                latencies.append(clock() - t0)
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(depth)))
        elapsed = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu0
        await conn.close()
        latencies.sort()
        return {"count": count, "elapsed": elapsed, "bytes": count * len(body), "cpu": cpu,
                "p50": latencies[len(latencies) // 2] if latencies else 0.0,
                "p99": latencies[int(len(latencies) * 0.99)] if latencies else 0.0}

    with asyncio.Runner(loop_factory=_new_loop) as runner:
        results.put(runner.run(main()))


# ------------------------------------------------------------------ driver


def _get_while_alive(queue: Any, procs: list, timeout: float, what: str) -> Any:
    """queue.get(timeout=timeout), but a process of `procs` that exits with an error ends the wait
    at once with its exit code (its traceback is on stderr already), not after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=0.2)
        except Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"{what} exited with code {failed[0]} (its traceback is above)") from None
            if time.monotonic() >= deadline:
                raise


def run_case(ctx: Any, name: str, settings: dict[str, str], port: int, workload: str, clients: int, depth: int,
             duration: float, control: Any, answers: Any) -> dict:
    ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=client_main,
                         args=(name, settings, port, workload, depth, duration, ready, go, results))
             for _ in range(clients)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            _get_while_alive(ready, procs, 60, f"{name} client")
        control.put("mark")
        server_cpu0 = answers.get(timeout=10)
        go.set()
        parts = [_get_while_alive(results, procs, duration + 60, f"{name} client") for _ in procs]
        control.put("mark")
        server_cpu = answers.get(timeout=10) - server_cpu0
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    elapsed = max(r["elapsed"] for r in parts)
    count = sum(r["count"] for r in parts)
    nbytes = sum(r["bytes"] for r in parts)
    return {
        "bench": "transport", "transport": name, "workload": workload, "clients": clients,
        "depth": depth, "duration_s": round(elapsed, 3), "requests": count,
        "ops_per_s": round(count / elapsed, 1),
        "mib_per_s": round(nbytes / elapsed / (1024 * 1024), 2),
        "p50_ms": round(max(r["p50"] for r in parts) * 1000, 3),
        "p99_ms": round(max(r["p99"] for r in parts) * 1000, 3),
        # CPU per request is what a loaded machine distorts least (server: its whole process).
        "server_cpu_us_per_req": round(server_cpu / count * 1e6, 2) if count else None,
        "client_cpu_us_per_req": round(sum(r["cpu"] for r in parts) / count * 1e6, 2) if count else None,
    }


def main(argv: list[str] | None = None) -> None:
    from equeue_core.plugins import get_plugin_manager

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per case")
    parser.add_argument("--clients", default="1,8", help="client process counts, comma separated")
    parser.add_argument("--transports", default=",".join(get_plugin_manager().names("equeue_transports")))
    args = parser.parse_args(argv)
    names = [n for n in args.transports.split(",") if n]
    client_counts = [int(c) for c in args.clients.split(",")]
    cases = [("small_rr", 1), ("small_rr", 32), ("bulk_64k", 8)]
    ctx = mp.get_context("spawn")
    rows: list[dict] = []
    certs_dir = Path(tempfile.mkdtemp(prefix="equeue-bench-transports-"))
    try:
        for name in names:
            server_settings, client_settings = settings_for(name, certs_dir)
            ready, stop, control, answers = ctx.Queue(), ctx.Event(), ctx.Queue(), ctx.Queue()
            server = ctx.Process(target=server_main, args=(name, server_settings, ready, stop, control, answers))
            server.start()
            try:
                port = _get_while_alive(ready, [server], 60, f"{name} server")
                for workload, depth in cases:
                    for clients in client_counts:
                        row = run_case(ctx, name, client_settings, port, workload, clients, depth, args.duration,
                                       control, answers)
                        row["cpus"] = os.cpu_count()
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                control.put(None)
                stop.set()
                server.join(30)
                if server.is_alive():
                    server.kill()
                    server.join()
    finally:
        shutil.rmtree(certs_dir, ignore_errors=True)
    base = {(r["workload"], r["clients"], r["depth"]): r for r in rows if r["transport"] == "tcp"}
    for r in rows:
        ref = base.get((r["workload"], r["clients"], r["depth"]))
        if r["transport"] == "tcp" or ref is None:
            continue
        key = "mib_per_s" if r["workload"] == "bulk_64k" else "ops_per_s"
        cpu = "server_cpu_us_per_req"
        print(json.dumps({"bench": "transport_ratio", "transport": r["transport"], "vs": "tcp",
                          "workload": r["workload"], "clients": r["clients"], "depth": r["depth"],
                          "metric": key, "ratio": round(r[key] / ref[key], 3) if ref[key] else None,
                          "server_cpu_ratio": round(r[cpu] / ref[cpu], 3) if ref[cpu] else None}),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
