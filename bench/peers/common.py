"""What every peer driver shares: starting a server in its own process group on a free loopback
port and always stopping it, running a client role in a child process, pacing a sender, and the
latency statistics.

Every process the harness starts (servers and client roles) inherits the environment, so a test
can find leftovers by the EQUEUE_BENCH_RUN marker it sets (tests/test_bench_peers.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.child import exit_reason, role_result

ROOT = Path(__file__).resolve().parent.parent.parent

# A latency message carries two wall-clock times (time.time_ns, one clock for every process on the
# host): when the sender made it, then when the pace meant it to be sent (its slot, start + i /
# rate). Warm-up messages carry 0 and are not counted. Latency from the first is what each row's
# p50_ms/p99_ms has always been; from the second (due_p50_ms/due_p99_ms) it also counts the time
# a message waited for its sender to get round to it: a sender that waits for each answer (XADD,
# EQueue's `send`) sends nothing while a server or client stalls, so its stamps start after the
# stall and latency from them leaves the stall out (coordinated omission), while a sender that
# does not wait (send_async, publish_async, publishes without confirms) stamps on time and its
# messages count the whole stall. From the slot, every sender is measured the same way.
STAMP_BYTES = 16
_STAMP = struct.Struct("<QQ")


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_binary(*names: str) -> str | None:
    """The reason a peer cannot run when one of its programs is not on PATH, else None."""
    for name in names:
        if shutil.which(name) is None:
            return f"{name} not found on PATH"
    return None


def missing_module(*modules: str) -> str | None:
    import importlib.util

    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"Python module {module} not installed (pip install -e '.[bench]')"
    return None


def wait_port(port: int, proc: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"server {exit_reason(proc.returncode)} before listening on {port}: {tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU time of `pid` and every live process descended from it: each live thread's time on a
    CPU in nanoseconds (/proc/<pid>/task/<tid>/schedstat; the 10 ms clock ticks of utime/stime are
    too coarse for a row of 10k cheap messages), plus the user + system time of the children each
    process reaped (cutime + cstime). None without a pid or once the process is gone. A server's
    workers and helpers (RabbitMQ's beam.smp under its start script) count; a helper that
    daemonized away from the tree does not, nor a thread that ended during the row."""
    if pid is None:
        return None
    children: dict[int, list[int]] = {}
    reaped: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        # after the command's ")": state, ppid, ..., utime (12th), stime, cutime, cstime
        children.setdefault(int(fields[1]), []).append(int(entry))
        reaped[int(entry)] = int(fields[13]) + int(fields[14])
    if pid not in reaped:
        return None
    tree, todo = [pid], [pid]
    while todo:
        found = children.get(todo.pop(), [])
        tree += found
        todo += found
    total = sum(reaped[p] for p in tree) / os.sysconf("SC_CLK_TCK")
    for p in tree:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            total += thread_cpu_seconds(p, tid)
    return total


def thread_schedstat(pid: int | str, tid: int | str) -> tuple[int, int] | None:
    """One thread's scheduler counters so far, in nanoseconds: (time on a CPU, time runnable but
    waiting for one), from /proc/<pid>/task/<tid>/schedstat; None once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return None


def thread_cpu_seconds(pid: int | str, tid: int | str) -> float:
    """One thread's time on a CPU so far (`thread_schedstat`); 0.0 once it is gone."""
    counters = thread_schedstat(pid, tid)
    return 0.0 if counters is None else counters[0] / 1e9


class ServerProcess:
    """A peer server in its own process group (start_new_session), so stop() reaches every process
    it forks (Erlang's helpers, a shell wrapper's child). stop() is safe to call twice."""

    def __init__(self, cmd: Sequence[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.cmd = list(cmd)
        self.log = log
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self, port: int, timeout: float = 30.0) -> ServerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True)
        try:
            wait_port(port, self.proc, timeout, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int | None:
        """The server's process (its process group's leader); None when not running."""
        return None if self.proc is None else self.proc.pid

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if _group_gone(pgid, self.proc, wait):
                break
        self.proc = None


def _group_gone(pgid: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def run_role(driver: str, role: str, args: dict, timeout: float = 600) -> dict:
    """Run `role` of bench/peers/<driver>.py in a fresh Python process; it prints one JSON line."""
    return role_result([sys.executable, "-m", "bench.peers.role", driver, role, json.dumps(args)],
                       what=f"{driver} {role}", cwd=ROOT, timeout=timeout)


def run_latency(driver: str, args: dict, timeout: float = 300) -> dict:
    """Receiver and paced sender in two processes (so a sender that spins only starves itself):
    the receiver prints "ready" once subscribed, then one JSON line with the latencies."""
    recv = subprocess.Popen([sys.executable, "-m", "bench.peers.role", driver, "latency_receiver", json.dumps(args)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None
        line = recv.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{driver} latency receiver: {line}{recv.stderr.read()[-1500:] if recv.stderr else ''}")
        sent = run_role(driver, "latency_sender", args, timeout)
        out, err = recv.communicate(timeout=args["seconds"] + 60)
        if recv.returncode != 0:
            raise RuntimeError(f"{driver} latency receiver {exit_reason(recv.returncode)}: {err.strip()[-1500:]}")
        res = json.loads(out.strip().splitlines()[-1])
        # a sender that could not keep the pace says so: achieved_rate below the asked rate
        return {**res, "sent": sent["count"], "achieved_rate": round(sent["count"] / sent["seconds"], 1),
                "sender_cpu_us_per_msg": sent.get("sender_cpu_us_per_msg")}
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.communicate()


class Pace:
    """The slots of a steady `rate` per second from now, on the wall clock (time.time_ns, what
    `stamp` writes and the receivers read): slot i is due at `due_ns(i)`. Pacing on that clock,
    not perf_counter, means a message is never sent before its slot even while the wall clock is
    slewed, so its latency from the slot is never below its latency from the stamp."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.perf_counter()  # for the elapsed seconds only
        self.start_ns = time.time_ns()

    def due_ns(self, i: int) -> int:
        return self.start_ns + round(i * 1e9 / self.rate)

    def remaining(self, i: int) -> float:
        """Seconds until slot i (0 once it has come)."""
        return max(0, self.due_ns(i) - time.time_ns()) / 1e9

    def wait(self, i: int, spin: bool) -> int:
        """Return slot i's time once it has come: spinning (the thread stays busy) or sleeping.
        An async sender sleeps `remaining(i)` its own way first, then calls this to spin out what
        a sleep that ended a hair early left."""
        if not spin and (delay := self.remaining(i)):
            time.sleep(delay)
        due = self.due_ns(i)
        while time.time_ns() < due:
            pass
        return due


def paced(count: int, rate: float, spin: bool, send: Callable[[int, int], object]) -> dict:
    """Call send(i, due_ns) at a steady `rate` per second (due_ns: the slot's wall-clock time, for
    `stamp`); between sends the caller's thread either sleeps or spins (stays busy, as an
    application that computes between sends). Returns the sender's row (`sender_row`)."""
    pace = Pace(rate)
    cpu = time.process_time()
    for i in range(count):
        send(i, pace.wait(i, spin))
    return sender_row(count, time.perf_counter() - pace.start, time.process_time() - cpu, spin)


def sender_row(count: int, seconds: float, cpu_seconds: float, spin: bool) -> dict:
    """A paced sender's row: `rate_row`, and `sender_cpu_us_per_msg`, the sender process's CPU a
    message while it sent (all its threads: a client's own I/O thread too). None for a sender
    that spins: its CPU is its whole slot, whatever the client costs."""
    return {**rate_row(count, seconds),
            "sender_cpu_us_per_msg": None if spin or not count else round(cpu_seconds * 1e6 / count, 1)}


def chunks(count: int, budget: float, chunk: int = 1000):
    """Yield the sizes of successive chunks of `count` sends, stopping early once `budget`
    seconds have passed (so a slow peer bounds the run's time; the row gives the count done)."""
    end = time.perf_counter() + budget
    for i in range(0, count, chunk):
        if i and time.perf_counter() > end:
            return
        yield min(chunk, count - i)


def stamp(size: int, due_ns: int | None = None) -> bytes:
    """A latency message's body: the time now, then its slot's time (`due_ns`, now without one)."""
    now = time.time_ns()
    return _STAMP.pack(now, now if due_ns is None else due_ns) + b"\0" * (size - STAMP_BYTES)


# A message slower than SLOW_MS from its stamp is slow; slow messages stamped within EPISODE_GAP_MS
# of the slow one before belong to one episode. Many slow messages in few episodes are stalls
# (a process, or a vCPU, that did not run for a few ms: every message in flight meanwhile is
# late); about as many episodes as slow messages is a fat tail of the path itself.
SLOW_MS = 1.0
EPISODE_GAP_MS = 5.0


def episodes(stamps_ns: Sequence[int], gap_ms: float = EPISODE_GAP_MS) -> list[tuple[int, int]]:
    """(first stamp, size) of each run of `stamps_ns` (in any order) whose neighbours, once sorted,
    are at most `gap_ms` apart, in time order."""
    runs: list[list[int]] = []
    last = None
    for t in sorted(stamps_ns):
        if last is None or t - last > gap_ms * 1e6:
            runs.append([t, 0])
        runs[-1][1] += 1
        last = t
    return [(start, size) for start, size in runs]


def slow_summary(slow_stamps: Sequence[int]) -> dict:
    """`over_1ms` (how many), `slow_episodes` and `largest_episode` (its messages) of the stamps of
    the slow messages (see SLOW_MS)."""
    sizes = [size for _, size in episodes(slow_stamps)]
    return {"over_1ms": len(slow_stamps), "slow_episodes": len(sizes), "largest_episode": max(sizes, default=0)}


class Latencies:
    """What a latency receiver collects: each message's milliseconds since its sender stamped it,
    and since its slot in the pace (see STAMP_BYTES), the stamps of the slow ones (SLOW_MS), and
    the receiver process's CPU from its first message on (read every CPU_EVERY messages, not
    each: a CPU-time clock read is a system call, and it would be on the path measured)."""

    CPU_EVERY = 256

    def __init__(self) -> None:
        self.sent: list[float] = []
        self.due: list[float] = []
        self.slow_stamps: list[int] = []
        self._cpu_first = 0.0  # process CPU after the first message
        self._cpu_last = 0.0  # ... and after message _cpu_n
        self._cpu_n = 0

    def __len__(self) -> int:
        return len(self.sent)

    def add(self, body: bytes, now: int | None = None) -> bool:
        """Count a body received `now` (time.time_ns(), read here without one); False (nothing
        counted) for a warm-up message."""
        if now is None:
            now = time.time_ns()
        sent, due = _STAMP.unpack_from(body)
        if sent == 0:
            return False
        ms = (now - sent) / 1e6
        self.sent.append(ms)
        self.due.append((now - due) / 1e6)
        if ms > SLOW_MS:
            self.slow_stamps.append(sent)
        n = len(self.sent)
        if n % self.CPU_EVERY == 1:  # the first message, then every CPU_EVERY
            cpu = time.process_time()
            if n == 1:
                self._cpu_first = cpu
            else:
                self._cpu_last, self._cpu_n = cpu, n
        return True

    def summary(self) -> dict:
        """`summary` of the latencies from the stamps, and the same from the slots as due_p50_ms,
        due_p99_ms and due_max_ms; `over_1ms` (slow messages, from the stamp), `slow_episodes`
        and `largest_episode` (`slow_summary`); `receiver_cpu_us_per_msg` (None before
        CPU_EVERY + 1 messages)."""
        due = summary(self.due)
        cpu = round((self._cpu_last - self._cpu_first) * 1e6 / (self._cpu_n - 1), 1) if self._cpu_n else None
        return {**summary(self.sent), **{f"due_{k}": v for k, v in due.items() if k != "count"},
                **slow_summary(self.slow_stamps), "receiver_cpu_us_per_msg": cpu}


def warmup_body(size: int) -> bytes:
    return b"\0" * size


def summary(lat: list[float], quantiles: Sequence[float] = (0.5, 0.99)) -> dict:
    """Latencies in ms: their count, each quantile (0.5 -> "p50_ms", 0.999 -> "p999_ms") and the max;
    None for each when there are none."""
    names = ["p" + f"{q * 100:g}".replace(".", "") + "_ms" for q in quantiles]
    if not lat:
        return {"count": 0, **dict.fromkeys(names), "max_ms": None}
    lat = sorted(lat)
    n = len(lat)
    return {"count": n, **{name: round(lat[min(n - 1, int(n * q))], 3) for name, q in zip(names, quantiles, strict=True)},
            "max_ms": round(lat[-1], 3)}


def rate_row(count: int, seconds: float) -> dict:
    return {"count": count, "seconds": round(seconds, 4), "msgs_per_s": round(count / seconds, 1) if seconds else None}
