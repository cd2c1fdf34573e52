"""What the console knows of the broker: one AsyncAdminClient (re-connected after a failure) and a
sampler that keeps recent history (lag per group, counters per topic) for charts and rates.

The console holds no state of its own beyond that history: every page asks the broker through the
same AdminClient methods the CLI calls (`equeue topics`, `groups`, `message`, `stats` ...).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from equeue_core.client.admin import AsyncAdminClient
from equeue_core.errors import EQueueError

log = logging.getLogger("equeue.console")

HISTORY_POINTS = 720  # one hour at the default 5 s sampling


class BrokerUnreachable(Exception):
    """The broker did not answer; pages show this instead of their content."""


class ConsoleBackend:
    """The console's view of one broker: the whole console with `--broker`, one per broker of the
    cluster with `--nameserver` (equeue_core/console/cluster.py)."""

    def __init__(self, broker: str, sample_interval: float = 5.0) -> None:
        self.broker = broker
        self.sample_interval = sample_interval
        self._admin: AsyncAdminClient | None = None
        self._lock = asyncio.Lock()
        # group -> deque of (unix time, total lag, {"topic/queue": lag})
        self.lag_history: dict[str, deque[tuple[float, int, dict[str, int]]]] = {}
        self._samples: deque[dict[str, Any]] = deque(maxlen=2)  # the last two stats snapshots
        self.last_error: str | None = None
        self._task: asyncio.Task | None = None

    async def admin(self) -> AsyncAdminClient:
        async with self._lock:
            if self._admin is None:
                try:
                    self._admin = await AsyncAdminClient(self.broker).start()
                except (EQueueError, OSError) as e:
                    raise BrokerUnreachable(f"broker {self.broker} is unreachable: {e}") from None
            return self._admin

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call an AdminClient method; a lost connection is dropped and re-made on the next call."""
        admin = await self.admin()
        try:
            return await getattr(admin, method)(*args, **kwargs)
        except (OSError, EQueueError) as e:
            if isinstance(e, OSError) or e.code in ("connection_lost", "closed", "timeout", "transport"):
                await self._drop()
                raise BrokerUnreachable(f"broker {self.broker} is unreachable: {e}") from None
            raise

    async def _drop(self) -> None:
        async with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            try:
                await admin.close()
            except (EQueueError, OSError):
                pass

    # ---------------------------------------------------------------- history

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._drop()

    async def sample(self) -> dict[str, Any]:
        snap = await self.call("stats")
        self._samples.append(snap)
        for group, g in snap["groups"].items():
            per_queue = {f"{t}/{q}": n for t, q, n in g["queues"]}
            hist = self.lag_history.setdefault(group, deque(maxlen=HISTORY_POINTS))
            hist.append((snap["time"], sum(per_queue.values()), per_queue))
        return snap

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.sample()
                self.last_error = None
            except BrokerUnreachable as e:
                self.last_error = str(e)
            except Exception as e:  # the sampler must outlive any one bad answer
                log.exception("sampling the broker failed")
                self.last_error = f"{type(e).__name__}: {e}"
            await asyncio.sleep(self.sample_interval)

    def topic_rates(self) -> dict[str, tuple[float, float]]:
        """(in msg/s, out msg/s) per topic over the last two samples ({} before the second)."""
        if len(self._samples) < 2:
            return {}
        a, b = self._samples
        dt = b["time"] - a["time"]
        if dt <= 0:
            return {}
        out = {}
        for topic, t in b["topics"].items():
            p = a["topics"].get(topic, {})
            out[topic] = ((t["messages_in"] - p.get("messages_in", 0)) / dt,
                          (t["messages_out"] - p.get("messages_out", 0)) / dt)
        return out

    def lag_series(self, group: str) -> dict[str, Any]:
        """The group's lag history as columns for the chart: times, total, and one per queue."""
        return lag_columns(self.lag_history.get(group, ()))


def lag_columns(history: Any) -> dict[str, Any]:
    """A lag history (points of (time, total, {queue: lag})) as the chart's columns: times, total,
    and one per queue (None where a queue had no point)."""
    hist = list(history)
    queues = sorted({q for _, _, per in hist for q in per})
    return {"t": [round(t, 3) for t, _, _ in hist], "total": [n for _, n, _ in hist],
            "queues": {q: [per.get(q) for _, _, per in hist] for q in queues},
            "sampled": time.time()}
