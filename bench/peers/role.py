"""Entry point of a client role's child process: `python -m bench.peers.role <driver> <role> <json>`.

Client roles run in their own processes so the harness's own work (and another role's) never
shares their interpreter; each prints one JSON line (the latency receiver prints "ready" first).
"""

from __future__ import annotations

import importlib
import json
import sys

from bench.peers.common import ROOT


def main(argv: list[str]) -> None:
    driver, role, args = argv[0], argv[1], json.loads(argv[2])
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module = importlib.import_module(f"bench.peers.{driver}")
    out = getattr(module, role)(**args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
