"""The console's view of a cluster (`--nameserver`): the brokers come from the name servers, and
each broker gets the same per-broker ConsoleBackend that `--broker` mode uses (its own
AsyncAdminClient and stats history). Pages ask each broker through those backends, so the console
keeps calling the same AdminClient methods as the CLI; the id and key lookups go through the
cluster admin client (`AdminClient(nameserver=...)`), which routes an id to the broker it names and
fans a key out to every broker that has the topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from equeue_core.client.cluster_admin import AsyncClusterAdminClient
from equeue_core.console.backend import HISTORY_POINTS, BrokerUnreachable, ConsoleBackend, lag_columns
from equeue_core.errors import EQueueError
from equeue_core.nameserver.routes import BrokerSummary

log = logging.getLogger("equeue.console")


class ClusterBackend:
    """One ConsoleBackend per live broker (by broker name), refreshed from the name servers at
    every sample; a sampler that samples every broker and keeps the cluster's lag history per
    group, one column per (broker, topic, queue)."""

    def __init__(self, nameserver: str, sample_interval: float = 5.0) -> None:
        self.nameserver = nameserver
        self.broker = f"name servers {nameserver}"  # what the page header shows
        self.sample_interval = sample_interval
        self.admin = AsyncClusterAdminClient(nameserver)
        self.summaries: dict[str, BrokerSummary] = {}
        self.backends: dict[str, ConsoleBackend] = {}
        self.lag_history: dict[str, deque[tuple[float, int, dict[str, int]]]] = {}
        self.last_error: str | None = None
        self._task: asyncio.Task | None = None

    async def refresh(self) -> list[BrokerSummary]:
        """The live brokers, from the name servers; a backend is made for each new one."""
        try:
            live = await self.admin.brokers()
        except (EQueueError, OSError) as e:
            raise BrokerUnreachable(f"no name server of {self.nameserver} answered: {e}") from None
        self.summaries = {b.name: b for b in live}
        for b in live:
            known = self.backends.get(b.name)
            if known is None or known.broker != b.address:
                if known is not None:
                    await known.stop()
                self.backends[b.name] = ConsoleBackend(b.address, self.sample_interval)
        return live

    def chosen(self, broker: str | None) -> dict[str, ConsoleBackend]:
        """All live brokers' backends, or the named one's (EQueueError for an unknown name)."""
        live = {n: b for n, b in self.backends.items() if n in self.summaries}
        if not broker:
            return live
        if broker not in live:
            raise EQueueError(f"no live broker named {broker}; live: {', '.join(sorted(live)) or 'none'}")
        return {broker: live[broker]}

    async def each(self, method: str, *args: Any, broker: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Call an AdminClient method on every live broker (or the named one), at once: broker name
        -> answer, or the BrokerUnreachable/EQueueError that broker gave (the page shows it)."""
        await self.refresh()
        targets = self.chosen(broker)

        async def one(b: ConsoleBackend) -> Any:
            return await b.call(method, *args, **kwargs)

        answers = await asyncio.gather(*(one(b) for b in targets.values()), return_exceptions=True)
        out: dict[str, Any] = {}
        for name, a in zip(targets, answers, strict=True):
            if isinstance(a, BaseException) and not isinstance(a, (EQueueError, BrokerUnreachable)):
                raise a
            out[name] = a
        return dict(sorted(out.items()))

    def rates(self) -> dict[str, tuple[float, float]]:
        """(in msg/s, out msg/s) per broker over its last two samples, user and system topics."""
        out = {}
        for name, b in self.backends.items():
            r = b.topic_rates()
            if r:
                out[name] = (sum(i for i, _ in r.values()), sum(o for _, o in r.values()))
        return out

    # ---------------------------------------------------------------- history

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for b in self.backends.values():
            await b.stop()
        await self.admin.close()

    async def sample(self) -> None:
        """Sample every live broker; one point per group, its queues keyed "broker:topic/queue"."""
        await self.refresh()
        names = sorted(self.chosen(None))
        snaps = await asyncio.gather(*(self.backends[n].sample() for n in names), return_exceptions=True)
        errors, points, when = [], {}, 0.0
        for name, snap in zip(names, snaps, strict=True):
            if isinstance(snap, BaseException):
                errors.append(f"{name}: {snap}")
                continue
            when = max(when, snap["time"])
            for group, g in snap["groups"].items():
                per = points.setdefault(group, {})
                per.update({f"{name}:{t}/{q}": n for t, q, n in g["queues"]})
        for group, per in points.items():
            hist = self.lag_history.setdefault(group, deque(maxlen=HISTORY_POINTS))
            hist.append((when, sum(per.values()), per))
        self.last_error = "; ".join(errors) or None

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.sample()
            except BrokerUnreachable as e:
                self.last_error = str(e)
            except Exception as e:  # the sampler must outlive any one bad answer
                log.exception("sampling the cluster failed")
                self.last_error = f"{type(e).__name__}: {e}"
            await asyncio.sleep(self.sample_interval)

    def lag_series(self, group: str) -> dict[str, Any]:
        return lag_columns(self.lag_history.get(group, ()))
