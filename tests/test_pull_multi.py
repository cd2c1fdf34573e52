"""PULL_MULTI (docs/protocol.md, broker/multi_pull.py): the next records of several queues in one
request, against a real broker process. Each section is answered exactly as a PULL of the same
fields would be on its first read (compared byte for byte), a failed section does not stop the
others, nothing is held, and the records fit one byte budget; a LitePullConsumer catching up on
many queues sends such frames, and falls back to PULLs when its broker does not know the code."""

from __future__ import annotations

import time

import pytest

from equeue_core import record
from equeue_core.broker.multi_pull import DETAIL_CHARS, ERROR_MESSAGE_CHARS, records_budget
from equeue_core.client import AdminClient, LitePullConsumer, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.codes import MAX_PULL_SECTIONS, Code, PullStatus
from equeue_core.errors import ProtocolError
from equeue_core.frame import Frame
from tests.helpers.broker import BrokerProcess
from tests.helpers.proxy import CuttableProxy

TOPICS = ("pm.a", "pm.b", "pm.empty")


def request(address: str, code: int, header: dict, timeout: float = 10.0) -> Frame:
    """One request and its answer (an error answer raised as its EQueueError)."""
    async def go() -> Frame:
        conn = await BrokerConnection(address).connect()
        try:
            return await conn.request(code, header, timeout=timeout)
        finally:
            await conn.close()

    return run_sync(go())


def requests(address: str, frames: list[tuple[int, dict]]) -> list[Frame]:
    """Several requests, one after another on one connection."""
    async def go() -> list[Frame]:
        conn = await BrokerConnection(address).connect()
        try:
            return [await conn.request(code, header, timeout=10) for code, header in frames]
        finally:
            await conn.close()

    return run_sync(go())


def sections(answer: Frame) -> list[tuple[dict, bytes]]:
    """Each result of a PULL_MULTI answer as (the header a PULL would have, its records)."""
    out, pos, body = [], 0, bytes(answer.body)
    for result in answer.header["results"]:
        if isinstance(result, dict):
            out.append((result, b""))
            continue
        status, next_offset, min_offset, max_offset, count, length = result
        out.append(({"status": status, "next_offset": next_offset, "min_offset": min_offset,
                     "max_offset": max_offset, "count": count}, body[pos:pos + length]))
        pos += length
    assert pos == len(body)
    return out


def pull(topic: str, queue_id: int, offset: int, max_count: int, tags: list[int] | None = None) -> dict:
    h = {"group": "g", "topic": topic, "queue_id": queue_id, "offset": offset, "max_count": max_count,
         "hold_ms": 0}
    if tags:
        h["tags"] = tags
    return h


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("pull-multi") / "data").start()
    try:
        with AdminClient(b.address) as admin:
            for t in TOPICS:
                admin.create_topic(t, queues=4)
        # round robin, one counter: pm.a's 100 go to queues 0 and 2, pm.b's to 1 and 3, and
        # each queue's tag changes every other message
        with Producer(b.address) as p:
            for i in range(200):
                p.send(Message(TOPICS[i % 2], b"body-%d" % i, tag="even" if (i // 2) // 4 % 2 else "odd"))
        yield b
    finally:
        b.stop()


def test_each_section_is_answered_as_its_pull_would_be(broker):
    """Queues of two topics, one twice at two offsets, one empty, with and without a tag filter:
    every section's status, offsets, count and records are those of the PULL of the same fields."""
    even = record.tag_hash("even")
    asked = [["pm.a", 0, 0, 10, None], ["pm.b", 1, 3, 50, None], ["pm.a", 0, 5, 7, None],
             ["pm.empty", 3, 0, 10, None], ["pm.b", 3, 0, 1000, [even]]]
    multi = request(broker.address, Code.PULL_MULTI, {"group": "g", "pulls": asked})
    singles = requests(broker.address, [(Code.PULL, pull(t, q, o, n, tags)) for t, q, o, n, tags in asked])
    got = sections(multi)
    assert len(got) == len(asked)
    for (header, records), single in zip(got, singles, strict=True):
        assert header == {k: single.header[k] for k in header}
        assert records == bytes(single.body)
    assert got[0][0]["count"] == 10 and got[3][0]["status"] == PullStatus.NO_NEW
    assert 0 < got[4][0]["count"] < got[4][0]["next_offset"]  # the filter kept part of the queue


def test_a_failed_section_is_its_error_and_the_others_are_read(broker):
    """An invalid topic name (long), an unknown topic, a queue past the topic's count and an
    offset out of range: the first three are their errors (the message cut short, a long detail
    left out), the fourth OFFSET_RESET as a PULL's would be (or, with `strict`, its error), and
    the good sections around them are read."""
    long_topic = "nope-" + "x" * 300
    asked = [["pm.a", 2, 0, 5, None], [long_topic, 0, 0, 5, None], ["pm.nope", 0, 0, 5, None],
             ["pm.a", 9, 0, 5, None], ["pm.b", 1, 10_000, 5, None], ["pm.b", 1, 0, 5, None]]
    got = sections(request(broker.address, Code.PULL_MULTI, {"group": "g", "pulls": asked}))
    assert [h.get("error") for h, _ in got] == [None, "invalid_topic", "topic_not_found", "queue_not_found",
                                                None, None]
    assert len(got[1][0]["message"]) == ERROR_MESSAGE_CHARS
    for h, _ in got[1:4]:
        assert all(not isinstance(v, str) or len(v) <= DETAIL_CHARS for v in h.get("details", {}).values())
    assert got[2][0]["details"]["topic"] == "pm.nope" and got[3][0]["details"]["queue_id"] == 9
    assert got[4][0]["status"] == PullStatus.OFFSET_RESET and got[4][0]["count"] == 0
    assert got[0][0]["count"] == 5 and got[5][0]["count"] == 5
    strict = sections(request(broker.address, Code.PULL_MULTI,
                              {"group": "g", "pulls": asked[4:], "strict": True}))
    assert strict[0][0]["error"] == "offset_out_of_range" and strict[1][0]["count"] == 5


def test_what_it_reads_counts_in_the_broker_stats_as_pulls_do(broker):
    """messages_out and bytes_out of each section's topic grow by what the answer carried."""
    def out() -> dict[str, tuple[int, int]]:
        with AdminClient(broker.address) as admin:
            topics = admin.stats()["topics"]
        return {t: (topics[t]["messages_out"], topics[t]["bytes_out"]) for t in ("pm.a", "pm.b")}

    before = out()
    got = sections(request(broker.address, Code.PULL_MULTI,
                           {"group": "g", "pulls": [["pm.a", 0, 0, 7, None], ["pm.b", 1, 0, 4, None],
                                                    ["pm.a", 2, 0, 3, None]]}))
    after = out()
    assert after["pm.a"][0] - before["pm.a"][0] == 10 and after["pm.b"][0] - before["pm.b"][0] == 4
    assert after["pm.a"][1] - before["pm.a"][1] == len(got[0][1]) + len(got[2][1])
    assert after["pm.b"][1] - before["pm.b"][1] == len(got[1][1])


def test_nothing_is_held(broker):
    """Queues with nothing past the offset are answered no_new at once, not after a hold."""
    with AdminClient(broker.address) as admin:
        end = admin.queue_ranges("pm.a")[0][1]
    got = sections(request(broker.address, Code.PULL_MULTI,
                           {"group": "g", "pulls": [["pm.a", 0, end, 5, None], ["pm.empty", 3, 0, 5, None]]},
                           timeout=2.0))
    assert [(h["status"], h["count"], h["next_offset"]) for h, _ in got] == [
        (PullStatus.NO_NEW, 0, end), (PullStatus.NO_NEW, 0, 0)]


@pytest.mark.parametrize("pulls, says", [
    (None, "'pulls' must be a non-empty list"),
    ([], "'pulls' must be a non-empty list"),
    ([["pm.a", 0, 0, 5]], "pull 0 must be [topic, queue_id, offset, max_count, tags]"),
    ([["pm.a", 0, 0, 5, None], ["pm.a", "0", 0, 5, None]], "pull 1: the queue id must be an integer"),
    ([["pm.a", 0, "0", 5, None]], "pull 0: the offset must be an integer"),
    ([["pm.a", 0, 0, 5, ["even"]]], "pull 0: tags must be a list of tag hashes"),
    ([["pm.a", 0, 0, 5, None]] * (MAX_PULL_SECTIONS + 1), f"at most {MAX_PULL_SECTIONS} queues"),
])
def test_a_malformed_request_is_refused_whole(broker, pulls, says):
    header = {"group": "g"} if pulls is None else {"group": "g", "pulls": pulls}
    with pytest.raises(ProtocolError) as refused:
        request(broker.address, Code.PULL_MULTI, header)
    assert says in str(refused.value)


def test_the_records_fit_one_budget_and_the_rest_is_not_read(tmp_path):
    """With pull_max_bytes of ~2 KB, the answer stops before the section that would pass it; the
    first section is read whatever its size (as a lone PULL would be)."""
    assert records_budget(2048, 16 << 20, 4096, 3) == 2048
    assert records_budget(1 << 30, 16 << 20, 4096, 64) == (16 << 20) - 4096 - 64 * 512
    b = BrokerProcess(tmp_path / "data", env={"EQUEUE_PULL_MAX_BYTES": "2048"}).start()
    try:
        with AdminClient(b.address) as admin:
            admin.create_topic("pm.big", queues=3)
        with Producer(b.address) as p:
            results = [p.send(Message("pm.big", b"z" * size)) for size in (1500, 1500, 1500, 5000)]
        assert [r.queue_id for r in results] == [0, 1, 2, 0] or sorted(r.queue_id for r in results[:3]) == [0, 1, 2]
        q_big = results[3].queue_id
        asked = [["pm.big", q, 0, 10, None] for q in range(3)]
        got = sections(request(b.address, Code.PULL_MULTI, {"group": "g", "pulls": asked}))
        assert [h["count"] for h, _ in got] == [1]  # 1500 B of 2048; the next 1500 B would pass it
        big = sections(request(b.address, Code.PULL_MULTI, {"group": "g", "pulls": [["pm.big", q_big, 1, 10, None]]}))
        assert [h["count"] for h, _ in big] == [1] and len(big[0][1]) > 5000
    finally:
        b.stop()


def _drain(address: str, topic: str, total: int, midway=None,
           **kwargs) -> tuple[LitePullConsumer, dict[int, list[int]]]:
    """A LitePullConsumer's poll loop over the topic until `total` messages: the bodies per queue.
    `midway()` is called once, when half of them have arrived."""
    got: dict[int, list[int]] = {}
    c = LitePullConsumer("pm-drain", address, consume_from="first", **kwargs)
    c.assign(topic)
    seen = 0
    deadline = time.monotonic() + 30
    for _ in range(20_000):
        if seen >= total or time.monotonic() > deadline:
            break
        for m in c.poll(0.2):
            got.setdefault(m.queue_id, []).append(int(m.body))
            seen += 1
        if midway is not None and seen >= total // 2:
            midway()
            midway = None
    return c, got


def _fill(address: str, topic: str, queues: int, per_queue: int) -> dict[int, list[int]]:
    """per_queue messages in each queue (round robin): the bodies sent to each, in order."""
    with AdminClient(address) as admin:
        admin.create_topic(topic, queues=queues)
    sent: dict[int, list[int]] = {}
    with Producer(address) as p:
        for i in range(queues * per_queue):  # one by one: a batch would go to one queue
            sent.setdefault(p.send(Message(topic, b"%d" % i)).queue_id, []).append(i)
    assert sorted(len(v) for v in sent.values()) == [per_queue] * queues
    return sent


def test_a_lite_pull_consumer_catches_up_on_many_queues_in_pull_multi_frames(tmp_path):
    """200 queues of 40 messages, and one more message in each queue sent when half have
    arrived (so into queues that caught up while others still catch up, whose held pulls wait for
    the next PULL_MULTI's write): every message once, in order per queue, and the queues with a
    backlog were asked in PULL_MULTI frames (fewer frames than queue pulls)."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        sent = _fill(b.address, "pm.many", 200, 40)

        def one_more_each() -> None:
            with Producer(b.address) as p:
                for i in range(200):
                    sent[p.send(Message("pm.many", b"%d" % (10_000 + i))).queue_id].append(10_000 + i)

        c, got = _drain(b.address, "pm.many", 200 * 41, midway=one_more_each)
        try:
            assert got == sent
            assert 0 < c.stats["multi_pulls"] < c.stats["pulls"] / 4
        finally:
            c.close()
    finally:
        b.stop()


def test_pulls_left_out_of_an_answer_by_its_budget_are_sent_again(tmp_path):
    """pull_max_bytes of 4 KB and 1 KB messages: each PULL_MULTI answer carries three or four
    queues' records and leaves the others out; those queues pull again, and every message still
    arrives once, in order."""
    b = BrokerProcess(tmp_path / "data", env={"EQUEUE_PULL_MAX_BYTES": "4096"}).start()
    try:
        with AdminClient(b.address) as admin:
            admin.create_topic("pm.budget", queues=20)
        sent: dict[int, list[int]] = {}
        with Producer(b.address) as p:
            for i in range(100):
                sent.setdefault(p.send(Message("pm.budget", b"%d" % i + b" " * 1000)).queue_id, []).append(i)
        c, got = _drain(b.address, "pm.budget", 100)
        try:
            assert got == sent
            assert c.stats["multi_pulls"] > 0 and c.stats["pulls"] > 20 + c.stats["multi_pulls"]
        finally:
            c.close()
    finally:
        b.stop()


def test_a_broker_without_pull_multi_gets_pulls_and_loses_nothing(tmp_path):
    """A broker of a release before PULL_MULTI (the proxy hands it the request under a code it
    does not know) answers unknown_request: the consumer pulls those queues again one by one, and
    sends PULLs from then on; every message arrives once, in order."""
    b = BrokerProcess(tmp_path / "data").start()
    proxy = CuttableProxy(b.port, renumber={int(Code.PULL_MULTI): 999})
    try:
        sent = _fill(b.address, "pm.old", 50, 20)
        c, got = _drain(proxy.address, "pm.old", 50 * 20)
        try:
            assert got == sent
            assert c.stats["multi_pulls"] == 1 and not c._multi
        finally:
            c.close()
    finally:
        proxy.close()
        b.stop()

