"""What a SEND_MULTI section costs the broker's event loop, against the same messages in one section.

A producer over 100 topics sends frames of ~80 sections of ~11 messages (one open batch per
topic, each leaving with its previous frame's answer), where one topic's frames are one
section of ~900. The broker's work per section (its checks, its copy and scan, the store's
stamp, log placement and queue-index write, the stats) is paid ~80 times as often, and that is
what keeps the 100-topic produce below one topic's in `bench.bench_queues` (docs/benchmarks.md,
"Page faults on every large frame, and what a SEND_MULTI section costs").

This calls `Broker.send_multi_now` in process, on a real Broker over the real file store in a
temporary directory (`--dir`; tmpfs or disk), with frames built once beforehand: no sockets and
no client, so the figure is the loop thread's own CPU (`time.thread_time`) for the frames, steady
enough on a shared machine to compare trees. Every frame carries `--messages` messages of `--size` bytes (100);
the cases cut them into 1, 10 and 80 sections over 100 topics of 4 queues. Cases run in turn in
each round (the order rotated a round), and each row gives its ratio to the one-section case of
the same round, and the page faults a frame. The process sets its allocator as `equeue broker`
does (equeue_core/allocator.py); `--glibc-malloc` leaves glibc's own thresholds, to see what
that costs. One JSON line per case and round, then a summary line per case (medians).

    .venv/bin/python -m bench.bench_sections                      # 300k messages a case, 5 rounds
    .venv/bin/python -m bench.bench_sections --dir /dev/shm --rounds 9 [--glibc-malloc]

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_queues import round_cases  # noqa: E402
from equeue_core.frame import Frame  # noqa: E402

TOPICS = [f"sections-{i}" for i in range(100)]
QUEUES = 4
SECTIONS = (1, 10, 80)
WARM_FRAMES = 20


def frames_for(sections: int, per_frame: int, count: int, size: int) -> list:
    """SEND_MULTI frames of `sections` sections, `per_frame` messages each, `count` messages in
    all (rounded up to whole frames), topics and queues in turn."""
    from equeue_core import record
    from equeue_core.codes import Code

    per_section = max(1, per_frame // sections)
    body = b"x" * size
    records = {t: b"".join(record.encode_record(t, body) for _ in range(per_section)) for t in TOPICS}
    frames = []
    for f in range(-(-count // (per_section * sections)) + WARM_FRAMES):
        layout, parts = [], []
        for i in range(sections):
            topic = TOPICS[(f * sections + i) % len(TOPICS)]
            layout.append([topic, (f + i) % QUEUES, len(records[topic])])
            parts.append(records[topic])
        frames.append(Frame(Code.SEND_MULTI, f + 1, 0, {"sections": layout}, b"".join(parts)))
    return frames


def run_case(broker, frames: list, sections: int) -> dict:
    """Send the frames (the first WARM_FRAMES untimed); the loop thread's CPU a message and a
    section. Each frame's body is a new bytearray, as the transport reads one into a new
    bytearray of its size (plugins/transport_tcp/framing.py): the allocator then sees what it
    sees in a broker process."""
    for frame in frames[:WARM_FRAMES]:
        broker.send_multi_now(None, _received(frame))
    timed = frames[WARM_FRAMES:]
    messages = sum(_messages(f) for f in timed)
    gc.collect()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu = time.thread_time()
    for frame in timed:
        broker.send_multi_now(None, _received(frame))
    cpu = time.thread_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"sections_per_frame": sections, "frames": len(timed), "messages": messages,
            "cpu_us_per_msg": round(cpu / messages * 1e6, 4),
            "cpu_us_per_section": round(cpu / (len(timed) * sections) * 1e6, 3),
            "page_faults_per_frame": round(faults / len(timed), 1)}


def _received(frame: Frame) -> Frame:
    return Frame(frame.code, frame.request_id, frame.flags, frame.header, bytearray(frame.body))


def _messages(frame) -> int:
    from equeue_core import record

    return len(record.scan(frame.body))


async def bench(args: argparse.Namespace) -> list[dict]:
    from equeue_core.allocator import keep_freed_memory
    from equeue_core.broker.broker import Broker
    from equeue_core.config import load
    from tests.helpers.ports import free_port

    malloc = None if args.glibc_malloc else keep_freed_memory()  # as the broker command does
    cases = {s: frames_for(s, args.messages, args.count, args.size) for s in SECTIONS}
    rows = []
    with tempfile.TemporaryDirectory(prefix="equeue-bench-sections-", dir=args.dir) as data:
        broker = Broker(load(overrides={"data_dir": data, "port": free_port(), "metrics_port": 0,
                                        "flush": "async"}))
        await broker.start()
        try:
            for topic in TOPICS:
                broker.topics.create(topic, QUEUES)
            for r in range(args.rounds):
                order = round_cases(list(SECTIONS), r)
                got = {s: run_case(broker, cases[s], s) for s in order}
                for s in SECTIONS:
                    row = {"bench": "sections", "round": r, "position": order.index(s), "malloc": malloc, **got[s],
                           "vs_one_section": round(got[s]["cpu_us_per_msg"] / got[1]["cpu_us_per_msg"], 3)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            await broker.stop()
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for s in SECTIONS:
        mine = [r for r in rows if r["sections_per_frame"] == s]
        out.append({"bench": "sections_summary", "sections_per_frame": s, "rounds": len(mine),
                    "malloc": mine[0]["malloc"],
                    "page_faults_per_frame": round(statistics.median(r["page_faults_per_frame"] for r in mine), 1),
                    "cpu_us_per_msg": round(statistics.median(r["cpu_us_per_msg"] for r in mine), 4),
                    "cpu_us_per_section": round(statistics.median(r["cpu_us_per_section"] for r in mine), 3),
                    "vs_one_section": round(statistics.median(r["vs_one_section"] for r in mine), 3)})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=300_000, help="messages a case and round")
    p.add_argument("--messages", type=int, default=880, help="messages a frame")
    p.add_argument("--size", type=int, default=100, help="body bytes")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", help="where the store's temporary directory goes (default: the system's)")
    p.add_argument("--glibc-malloc", action="store_true",
                   help="leave glibc's malloc thresholds as they are (the broker command fixes them)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.count < 1 or args.messages < max(SECTIONS):
        p.error(f"--rounds and --count must be at least 1, --messages at least {max(SECTIONS)}")
    for row in summary(asyncio.run(bench(args))):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
