"""Subprocess for the replica-log crash test: copies a master store into a replica store in small
pieces, printing "copied <end>" after each append_log, until killed or done ("done <end>")."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kit import open_store  # noqa: E402


def main(name: str, master_dir: str, replica_dir: str, chunk: int) -> None:
    master = open_store(name, master_dir, **_options(name))
    replica = open_store(name, replica_dir, **_options(name))
    src, dst = master.engine.replica_log, replica.engine.replica_log
    end = dst.end_position()
    print("ready", flush=True)
    for _ in range(1_000_000):
        data = src.read_log(end, chunk)
        if not data:
            break
        end = dst.append_log(end, data)
        print(f"copied {end}", flush=True)
    print(f"done {end}", flush=True)
    sys.stdin.read()  # hold the stores open until killed


def _options(name: str) -> dict:
    return {"chunk_size": 65536} if name == "file" else {}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
