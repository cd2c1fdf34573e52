"""The broker process keeps the memory of its freed frame-sized buffers for the next frame
(equeue_core/allocator.py): no page fault per page of every large frame.

Page faults are counted, not timed: a count does not depend on how busy the machine is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_queues import minor_faults
from equeue_core.allocator import is_glibc, malloc_settings
from equeue_core.client import AdminClient, Message, Producer
from tests.helpers.broker import BrokerProcess, live_stats_in_process

GLIBC = is_glibc()

# A SEND_MULTI's two large buffers, as the broker makes and frees them for every frame: the body
# the reads fill (bytearray) and the commit log's write of its sections joined (bytes).
FRAMES = r"""
import resource, sys
if sys.argv[1] == "kept":
    from equeue_core.allocator import keep_freed_memory
    assert keep_freed_memory() is not None
parts = [bytes(3700) for _ in range(51)]
def frame(i):
    body = bytearray(190_000 + (i % 7) * 1000)
    joined = b"".join(parts)
    del body, joined
for i in range(20):
    frame(i)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(200):
    frame(i)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""


def _faults_a_frame(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", FRAMES, mode], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return float(out.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_freed_frame_buffers_are_reused_without_page_faults():
    """With glibc's own thresholds, each frame's buffers come back as fresh pages (~50 faults a
    ~190 KB frame); with the broker's, the freed memory is taken again."""
    assert _faults_a_frame("plain") > 20
    assert _faults_a_frame("kept") < 1


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_the_broker_process_takes_no_page_faults_per_frame_over_many_topics(tmp_path: Path):
    """The whole path: a producer over 100 topics sends SEND_MULTI frames of a few hundred KB,
    and the broker process faults in no new pages for them. The same run with glibc's thresholds (set
    through its environment variables, which the broker then leaves alone) faults in pages for
    every frame, so this test tells the two apart."""
    topics = [f"t{i}" for i in range(100)]
    counts = {}
    for mode, env in (("kept", {}), ("glibc", {"MALLOC_MMAP_THRESHOLD_": "131072"})):
        with BrokerProcess(tmp_path / mode, env=env) as b, Producer(b.address) as p:
            with AdminClient(b.address) as admin:
                assert (admin.stats()["malloc"] is None) == (mode == "glibc")
            for t in topics:
                p.send(Message(t, b"warm"))
            before = minor_faults(b.proc.pid)
            futures = [p.send_async(Message(topics[i % 100], b"x" * 400)) for i in range(100_000)]
            for f in futures:
                f.result(60)
            counts[mode] = minor_faults(b.proc.pid) - before
    # (on the project's VM: ~560 against ~34,000)
    assert counts["glibc"] > 5000, counts
    assert counts["kept"] < counts["glibc"] / 10, counts


def test_a_broker_in_a_program_leaves_the_allocator_alone(tmp_path: Path):
    """Only the `equeue broker` command sets the thresholds: a Broker run inside another program
    (here pytest's) does not, and its BROKER_STATS say so."""
    assert live_stats_in_process(tmp_path / "in-program")["malloc"] is None
    assert malloc_settings() is None
