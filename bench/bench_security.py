"""What ACL signing, TLS and CURVE cost: produce and consume throughput and CPU per message, ACL on,
TLS on and both vs the plain broker, and CURVE vs the plain zmq broker, in the same run, batching on
(docs/benchmarks.md, "Security").

Each round starts a real broker process (plain, --acl-file, --tls-cert/--tls-key, both; zmq and
zmq with --curve-secret-key/--curve-allowed-keys) and runs the client in its own process; CPU is the client's (getrusage) plus the broker's (/proc/<pid>/stat) over the timed
part only. One JSON line per measurement, then one line of ratios per mode (mode / plain, and
zmq+curve / zmq).

    .venv/bin/python -m bench.bench_security --count 200000 --size 100 [--modes zmq,zmq+curve]

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.child import role_result  # noqa: E402
from tests.helpers.broker import BrokerProcess  # noqa: E402

ACCOUNT = ("bench", "bench-secret-0001")
ACL = f"""[[accounts]]
access_key = "{ACCOUNT[0]}"
secret_key = "{ACCOUNT[1]}"
topics = ["bench.*"]
groups = ["bench-*"]
"""


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_pid(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- client roles (child processes)

def role_produce(address: str, topic: str, count: int, size: int, creds: dict) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(address, **creds) as p:
        p.send(Message(topic, body))  # route lookup and connection warm-up
        msgs = [Message(topic, body) for _ in range(1000)]
        cpu0, t0 = _cpu_self(), time.perf_counter()
        for _ in range(count // 1000):
            p.send_batch(msgs)
        secs, cpu = time.perf_counter() - t0, _cpu_self() - cpu0
    return {"messages": count // 1000 * 1000, "seconds": secs, "client_cpu": cpu}


def role_consume(address: str, topic: str, group: str, count: int, creds: dict) -> dict:
    import threading

    from equeue_core.client import Consumer

    done = threading.Event()
    seen = [0]

    def handler(m) -> None:
        seen[0] += 1
        if seen[0] >= count:
            done.set()

    c = Consumer(group, address, consume_from="first", pull_batch=256, **creds).subscribe(topic)
    cpu0, t0 = _cpu_self(), time.perf_counter()
    c.start(handler)
    done.wait(600)
    secs, cpu = time.perf_counter() - t0, _cpu_self() - cpu0
    c.close()
    return {"messages": seen[0], "seconds": secs, "client_cpu": cpu}


def _child(args: list[str], broker: BrokerProcess) -> dict:
    cpu0 = _cpu_pid(broker.proc.pid)
    out = role_result([sys.executable, "-m", "bench.bench_security", "--role", *args], what=f"role {args[0]}",
                      cwd=ROOT, timeout=900)
    out["broker_cpu"] = _cpu_pid(broker.proc.pid) - cpu0  # includes the child's warm-up: small, same for both
    return out


MODES = ("plain", "acl", "tls", "acl+tls", "zmq", "zmq+curve")


def _baseline(mode: str) -> str:
    return "zmq" if mode.startswith("zmq") else "plain"


def _mode_setup(mode: str, acl: Path, certs, curve) -> tuple[list[str], dict, str]:
    """(broker flags, client options, address scheme) of one mode."""
    extra: list[str] = []
    creds: dict = {}
    if mode.startswith("zmq"):
        if "curve" in mode:
            extra += curve.broker_args()
            creds.update(curve.client_credentials())
        return extra, creds, "zmq"
    if "acl" in mode:
        extra += ["--acl-file", str(acl)]
        creds.update(access_key=ACCOUNT[0], secret_key=ACCOUNT[1])
    if "tls" in mode:
        extra += ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
        creds["tls_ca"] = str(certs.ca)
    return extra, creds, "tls" if "tls" in mode else "tcp"


def run(count: int, size: int, rounds: int, modes: tuple[str, ...] = MODES) -> None:
    """`rounds` alternating rounds of every mode (a shared machine is noisy); ratios of the medians
    to plain (to zmq for zmq+curve)."""
    from tests.helpers.certs import make_certs
    from tests.helpers.curve import make_curve_keys

    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        acl = Path(tmp) / "acl.toml"
        acl.write_text(ACL)
        certs = make_certs(Path(tmp) / "certs")
        curve = make_curve_keys(Path(tmp) / "curve")
        for rnd, mode in [(i, m) for i in range(rounds) for m in modes]:
            extra, options, scheme = _mode_setup(mode, acl, certs, curve)
            creds = json.dumps(options)
            b = BrokerProcess(Path(tmp) / f"{mode.replace('+', '-')}-{rnd}", extra_args=extra,
                              transport="zmq" if scheme == "zmq" else "tcp").start()
            address = f"{scheme}://127.0.0.1:{b.port}"
            try:
                for what, args in (("produce", ["produce", address, "bench.t", str(count), str(size), creds]),
                                   ("consume", ["consume", address, "bench.t", "bench-g", str(count), creds])):
                    r = _child(args, b)
                    n = r["messages"]
                    row = {"bench": "security", "mode": mode, "op": what, "messages": n, "size": size,
                           "msgs_per_s": round(n / r["seconds"]),
                           "cpu_us_per_msg": round((r["client_cpu"] + r["broker_cpu"]) / n * 1e6, 2),
                           "client_cpu_s": round(r["client_cpu"], 3), "broker_cpu_s": round(r["broker_cpu"], 3)}
                    results.setdefault(what, {}).setdefault(mode, []).append(row)
                    print(json.dumps(row), flush=True)
            finally:
                b.stop()
    for what, rows in results.items():
        def med(mode: str, key: str, rows: dict = rows) -> float:
            return statistics.median(row[key] for row in rows[mode])

        for mode in modes:
            base = _baseline(mode)
            if mode == base or base not in rows or mode not in rows:
                continue
            print(json.dumps({"bench": "security", "op": what, "ratio": f"{mode}/{base} (medians)",
                              "rounds": rounds,
                              "throughput": round(med(mode, "msgs_per_s") / med(base, "msgs_per_s"), 3),
                              "cpu_per_msg": round(med(mode, "cpu_us_per_msg") / med(base, "cpu_us_per_msg"),
                                                   3)}),
                  flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--role":
        role, *rest = sys.argv[2:]
        if role == "produce":
            address, topic, count, size, creds = rest
            out = role_produce(address, topic, int(count), int(size), json.loads(creds))
        else:
            address, topic, group, count, creds = rest
            out = role_consume(address, topic, group, int(count), json.loads(creds))
        print(json.dumps(out), flush=True)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3, help="rounds of all modes (default 3)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    a = p.parse_args()
    modes = tuple(a.modes.split(","))
    unknown = set(modes) - set(MODES)
    if unknown:
        p.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    run(a.count, a.size, a.rounds, modes)


if __name__ == "__main__":
    main()
