"""A client connection receives its large answers into bodies it kept from earlier ones
(framing.SpareBodies): a body is reused only once nothing else refers to it, so a frame, a batch
or a view anyone still holds is never written again, and every frame arrives intact whether its
body is new or reused."""

from __future__ import annotations

import random

from equeue_plugins.transport_tcp.framing import HANDOVER_MIN, FrameReader, SpareBodies

from equeue_core import frame as wire
from equeue_core.client import Consumer, Message, Producer
from tests.helpers.waiting import wait_until

from .test_frame_body_in_place import feed_in_pieces


def connection_spares(consumer: Consumer) -> SpareBodies:
    """The SpareBodies of a (single-broker) push Consumer's connection."""
    return consumer._async._conn._conn._proto.reader.spares


def frames_reader(spares: SpareBodies) -> tuple[FrameReader, list[wire.Frame]]:
    frames: list[wire.Frame] = []
    fatal: list[Exception] = []
    reader = FrameReader(wire.DEFAULT_MAX_FRAME, frames.append, lambda h, e: fatal.append(e),
                         lambda h, e: fatal.append(e), fatal.append, spares)
    return reader, frames


def big_frames(n: int, seed: int) -> list[wire.Frame]:
    """`n` frames with bodies of 300-400 KiB (past HANDOVER_MIN, received in place), each its own bytes."""
    rng = random.Random(seed)
    return [wire.Frame(1, i + 1, 0, {"n": i}, rng.randbytes(rng.randrange(300_000, 400_000))) for i in range(n)]


def test_a_body_nobody_holds_any_more_is_reused_for_the_next_frame_which_arrives_intact() -> None:
    spares = SpareBodies(8, 64 * 1024 * 1024)
    reader, frames = frames_reader(spares)
    sent = big_frames(6, seed=1)
    ids = set()
    for frame in sent:
        feed_in_pieces(reader, wire.encode_bytes(frame), [65_536, 7, 100_000])
        got = frames.pop()
        assert got.request_id == frame.request_id and bytes(got.body) == frame.body
        assert type(got.body) is bytearray and len(got.body) == len(frame.body)  # exactly its size
        ids.add(id(got.body))
        del got  # done with it, as a consumer is once its batch is handled
    assert spares.reused == 5 and spares.allocated == 1 and len(ids) == 1
    assert spares.idle_bytes == spares.kept_bytes > 0  # kept, referred to by nobody else


def test_bodies_still_held_by_their_frames_or_by_a_view_are_never_written_again() -> None:
    """Every frame is kept (as batches in flight are) and one body only through a memoryview:
    each later frame gets a body of its own, and every kept one still holds its own bytes."""
    spares = SpareBodies(8, 64 * 1024 * 1024)
    reader, frames = frames_reader(spares)
    sent = big_frames(5, seed=2)
    for frame in sent:
        feed_in_pieces(reader, wire.encode_bytes(frame), [65_536, 131_072])
    view = memoryview(frames[2].body)
    frames[2] = None  # type: ignore[call-overload]  # only the view refers to this one now
    for frame in big_frames(3, seed=3):
        feed_in_pieces(reader, wire.encode_bytes(frame), [65_536])
    assert spares.reused == 0 and spares.allocated == 8
    assert spares.idle_bytes == 0 < spares.kept_bytes  # every kept body is still referred to
    for i, frame in enumerate(sent):
        kept = view if i == 2 else frames[i].body
        assert bytes(kept) == frame.body, i


def test_only_bodies_that_fit_without_moving_are_reused_and_the_kept_ones_are_bounded() -> None:
    spares = SpareBodies(2, 64 * 1024 * 1024)
    small = spares.take(200_000)
    room = small.__alloc__()
    spares.keep(small)
    del small
    assert spares.reuse(room) is None  # no room left for its trailing byte: CPython would move it
    assert spares.reuse(room // 2 - 10) is None  # under half: CPython would shrink it, moving it
    again = spares.take(room - 1)
    assert len(again) == room - 1 and again.__alloc__() == room and spares.reused == 1
    for size in (150_000, 160_000, 170_000):
        spares.keep(bytearray(size))
    assert len(spares) == 2  # at most `count`: the oldest went
    capped = SpareBodies(10, 250_000)
    for size in (150_000, 160_000, 170_000):
        capped.keep(bytearray(size))
    assert len(capped) == 1  # at most max_bytes (but always the newest)


def test_a_consumer_reading_large_pull_answers_gets_every_message_intact(file_broker, tmp_path) -> None:
    """A real broker and push Consumer: 1 KiB messages pulled ~200 at a time (answers past
    HANDOVER_MIN), each body its own; every message arrives once with its own bytes, and the
    connection received most answers into bodies it had kept."""
    count = 3000
    with Producer(file_broker.address) as p:
        for f in [p.send_async(Message("t", i.to_bytes(4, "big") * 256)) for i in range(count)]:
            f.result()
    seen: dict[int, bytes] = {}
    c = Consumer("g", file_broker.address, consume_from="first", pull_batch=200,
                 offset_dir=str(tmp_path / "offsets"))
    c.subscribe("t")
    try:
        c.start(lambda m: seen.setdefault(int.from_bytes(m.body[:4], "big"), m.body))
        assert wait_until(lambda: len(seen) >= count, timeout=60), len(seen)
        spares = connection_spares(c)
    finally:
        c.close()
    assert all(seen[i] == i.to_bytes(4, "big") * 256 for i in range(count))
    assert 200 * 1024 >= HANDOVER_MIN and spares.reused > 0, (spares.reused, spares.allocated)
