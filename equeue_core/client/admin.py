"""AdminClient: topics, queues, group progress and lag, offset resets, DLQ inspection and re-send."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from equeue_core.broker.topics import DLQ_PREFIX
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.credentials import credentials
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.client.message import ReceivedMessage, decode_batch, received_from
from equeue_core.codes import Code
from equeue_core.errors import EQueueError, TopicNotFoundError


def reset_target(text: str) -> str | int:
    """Where a reset moves a group, from what a person types (CLI `--to`, console form):
    `earliest`, `latest`, epoch milliseconds, or an ISO date/time (UTC unless it names a zone)."""
    t = text.strip()
    if t in ("earliest", "latest"):
        return t
    if t.isdigit():
        return int(t)
    try:
        when = _dt.datetime.fromisoformat(t)
    except ValueError:
        raise EQueueError(f"reset target {text!r}: give earliest, latest, epoch ms or an ISO "
                          "date/time like 2026-11-23T09:30:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return int(when.timestamp() * 1000)


class AsyncAdminClient:
    """`AsyncAdminClient(broker="h:p")` administers one broker; `AsyncAdminClient(nameserver=
    "h:p,h:p")` gives an AsyncClusterAdminClient whose answers are per broker name."""

    def __new__(cls, broker: str = "127.0.0.1:10911", nameserver: str | None = None,
                **credentials: str | None) -> Any:
        if nameserver:
            from equeue_core.client.cluster_admin import AsyncClusterAdminClient

            return AsyncClusterAdminClient(nameserver, **credentials)
        return super().__new__(cls)

    def __init__(self, broker: str = "127.0.0.1:10911", nameserver: None = None, *,
                 access_key: str | None = None, secret_key: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 curve_server_key: str | None = None, curve_public_key: str | None = None,
                 curve_secret_key: str | None = None) -> None:
        self.broker = broker
        self._credentials = credentials(access_key=access_key, secret_key=secret_key, tls_ca=tls_ca,
                                        tls_cert=tls_cert, tls_key=tls_key, curve_server_key=curve_server_key,
                                        curve_public_key=curve_public_key, curve_secret_key=curve_secret_key)
        self._conn: BrokerConnection | None = None
        self._id_prefix = ""

    async def start(self) -> AsyncAdminClient:
        self._conn = await BrokerConnection(self.broker, **self._credentials).connect()
        from equeue_core.client.consumer import _id_prefix

        self._id_prefix = _id_prefix((await self.request(Code.BROKER_INFO))["address"])
        return self

    async def request(self, code: int, header: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self._conn is not None, "call start() first"
        return (await self._conn.request(code, header or {})).header

    async def broker_info(self) -> dict[str, Any]:
        return await self.request(Code.BROKER_INFO)

    async def stats(self) -> dict[str, Any]:
        """The broker's operating figures (BROKER_STATS): counters per topic, lag per group and
        queue, held pulls, connections, disk, latency histograms, recovery. The same snapshot the
        Prometheus endpoint renders; docs/operations.md describes each figure."""
        return await self.request(Code.BROKER_STATS)

    async def create_topic(self, topic: str, queues: int | None = None) -> int:
        h = {"topic": topic} if queues is None else {"topic": topic, "queues": queues}
        return (await self.request(Code.CREATE_TOPIC, h))["queues"]

    async def delete_topic(self, topic: str) -> None:
        await self.request(Code.DELETE_TOPIC, {"topic": topic})

    async def topics(self, system: bool = False) -> dict[str, Any]:
        return (await self.request(Code.LIST_TOPICS, {"system": system}))["topics"]

    async def queue_ranges(self, topic: str) -> list[list[int]]:
        return (await self.request(Code.QUEUE_RANGES, {"topic": topic}))["ranges"]

    async def groups(self, group: str | None = None) -> dict[str, Any]:
        return (await self.request(Code.GROUP_INFO, {"group": group} if group else {}))["groups"]

    async def reset_offsets(self, group: str, topic: str, to: str | int) -> list[list[Any]]:
        return (await self.request(Code.RESET_OFFSETS, {"group": group, "topic": topic, "to": to}))["offsets"]

    async def skip_record(self, group: str, topic: str, queue_id: int, offset: int) -> str:
        """Move a group past one record of a queue (a corrupt record its consumers stop at:
        they resume at offset + 1). Returns a one-line confirmation of what was skipped."""
        h = await self.request(Code.SKIP_RECORD, {"group": group, "topic": topic, "queue_id": queue_id,
                                                  "offset": offset})
        if not h["skipped"]:
            return f"nothing skipped: group {group} is already at offset {h['next_offset']} of {topic}/{queue_id}"
        what = h["corrupt"] or "the record was readable"
        return (f"skipped {topic}/{queue_id} offset {offset} for group {group} ({what}); "
                f"the group resumes at offset {h['next_offset']}")

    async def get_message(self, msg_id: str) -> ReceivedMessage:
        assert self._conn is not None
        body = (await self._conn.request(Code.GET_MESSAGE, {"msg_id": msg_id})).body
        return received_from(body, 0, msg_id[:12])

    async def find_by_key(self, topic: str, key: str, max_results: int = 32,
                          scan_limit: int = 100_000) -> list[ReceivedMessage]:
        """Messages of a topic carrying `key`, newest first, among the newest `scan_limit` of each
        queue (the broker scans; there is no key index)."""
        assert self._conn is not None
        resp = await self._conn.request(Code.QUERY_BY_KEY, {"topic": topic, "key": key, "max": max_results,
                                                            "scan_limit": scan_limit}, timeout=120)
        return decode_batch(resp.body, self._id_prefix)

    async def read_queue(self, topic: str, queue_id: int, offset: int, count: int) -> list[ReceivedMessage]:
        """Messages of one queue from offset on (no group, no long polling): for inspection."""
        assert self._conn is not None
        out: list[ReceivedMessage] = []
        while len(out) < count:
            resp = await self._conn.request(Code.PULL, {"group": "%ADMIN%", "topic": topic, "queue_id": queue_id,
                                                        "offset": offset, "max_count": min(256, count - len(out)),
                                                        "hold_ms": 0, "strict": True})
            h = resp.header
            if not h["count"]:
                break
            out.extend(decode_batch(resp.body, self._id_prefix))
            offset = h["next_offset"]
        return out

    async def dlq_messages(self, group: str, offset: int = 0, count: int = 100) -> list[ReceivedMessage]:
        try:
            return await self.read_queue(DLQ_PREFIX + group, 0, offset, count)
        except TopicNotFoundError:
            return []

    async def resend_dlq(self, group: str, msg_ids: list[str] | None = None) -> int:
        """Send DLQ messages (all, or those ids) back to their original topics. Returns how many."""
        from equeue_core.client.message import Message
        from equeue_core.client.producer import AsyncProducer

        msgs = await self.dlq_messages(group, 0, 1_000_000)
        if msg_ids is not None:
            wanted = set(msg_ids)
            msgs = [m for m in msgs if m.msg_id in wanted]
        if not msgs:
            return 0
        async with AsyncProducer(self.broker, **self._credentials) as producer:
            for m in msgs:
                props = {k: v for k, v in m.properties.items() if k not in ("RETRY_TOPIC", "ORIGIN_MSG_ID", "DLQ_REASON")}
                await producer.send_batch([Message(m.topic, m.body, m.tag, m.keys, props or None)])
        return len(msgs)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class AdminClient:
    """Blocking admin client; every method mirrors AsyncAdminClient."""

    def __init__(self, broker: str = "127.0.0.1:10911", nameserver: str | None = None,
                 **credentials: str | None) -> None:
        """`credentials`: access_key, secret_key, tls_ca/_cert/_key, curve_server_key/_public_key/
        _secret_key, as for AsyncAdminClient."""
        background_loop()
        self._async = AsyncAdminClient(broker, nameserver, **credentials)
        run_sync(self._async.start())

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._async, name)
        if not callable(fn):
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            return run_sync(fn(*args, **kwargs))

        return call

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
