"""A strategy shipped as its own package, installed into the venv, is picked by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "equeue-example-strategy"

SCRIPT = textwrap.dedent("""
    import sys, time
    from equeue_core.allocation import allocate
    from equeue_core.client import AsyncProducer, Consumer, Message
    from equeue_core.client.loop import run_sync

    assert allocate("sticky_last", "b", [0, 1, 2], ["a", "b"]) == [0, 1, 2]
    assert allocate("sticky_last", "a", [0, 1, 2], ["a", "b"]) == []

    async def produce():
        async with AsyncProducer(sys.argv[1], selector="first_queue") as p:
            return [(await p.send(Message("third", b"x"))).queue_id for _ in range(20)]
    assert set(run_sync(produce())) == {0}

    cs = [Consumer("g3", sys.argv[1], allocation="sticky_last", heartbeat_interval=0.3,
                   rebalance_interval=0.5).subscribe("third") for _ in range(2)]
    for c in cs:
        c.start(lambda m: None)
    deadline = time.monotonic() + 20
    def owners():
        return sorted(len([q for q in c.assigned_queues() if q[0] == "third"]) for c in cs)
    while owners() != [0, 4] and time.monotonic() < deadline:
        time.sleep(0.1)
    print("owners", owners())
    for c in cs:
        c.close()
""")


def test_strategy_from_a_separate_package_is_used_by_name(tmp_path, file_broker):
    src = tmp_path / "pkg"
    shutil.copytree(EXAMPLE, src)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", str(src)]
    r = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    try:
        listed = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "plugins"], capture_output=True,
                                text=True, timeout=60)
        assert "sticky_last" in listed.stdout and "equeue_example_strategy" in listed.stdout
        script = tmp_path / "use_it.py"
        script.write_text(SCRIPT)
        r = subprocess.run([sys.executable, str(script), file_broker.address], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "owners [0, 4]" in r.stdout
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "equeue-example-strategy"],
                       capture_output=True, timeout=120)
