"""The future send_async returns keeps the concurrent.futures API docs/client.md promises (result,
exception, done, add_done_callback with the future itself, await from asyncio), on a success and
on a refused batch; its SendResult names the message as the broker stored it. Its base, a
message's place in a batch, is made in C when the record hot path is built (no Python __init__ per
message): both bases must behave alike, and a reference cycle through the future must still be
collected by the garbage collector."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import weakref

import pytest

from equeue_core import record
from equeue_core.client import AdminClient, Message, Producer
from equeue_core.client.producer import SendFuture, _PyBatchSlot
from equeue_core.errors import InvalidMessageError, MessageTooLargeError

BASES = [_PyBatchSlot] + ([record.native_module.BatchSlot] if record.native_module is not None else [])


def test_send_async_futures_offer_result_exception_done_callbacks_and_await(file_broker):
    with Producer(file_broker.address) as p:
        p.send(Message("fut", b"warm-up"))
        futures = [p.send_async(Message("fut", f"m{i}".encode())) for i in range(50)]
        called: list[object] = []
        seen = threading.Event()

        def on_done(f) -> None:
            called.append(f)
            seen.set()

        futures[7].add_done_callback(on_done)
        results = [f.result(timeout=30) for f in futures]
        assert seen.wait(10) and called == [futures[7]]
        assert all(f.done() and f.exception() is None for f in futures)
        late: list[object] = []
        futures[3].add_done_callback(late.append)  # added after the answer: called at once
        assert late == [futures[3]]

        async def awaited() -> list:
            return [await p.send_async(Message("fut", b"awaited")) for _ in range(3)]

        results += asyncio.run(awaited())
    with AdminClient(file_broker.address) as admin:
        for r in results:
            stored = admin.read_queue("fut", r.queue_id, r.queue_offset, 1)[0]
            assert (stored.msg_id, stored.topic, stored.queue_offset) == (r.msg_id, r.topic, r.queue_offset)
    assert len({r.msg_id for r in results}) == len(results)


def test_a_refused_send_async_raises_the_typed_error_from_every_part_of_its_future(file_broker):
    with Producer(file_broker.address) as p:
        p.send(Message("big", b"warm-up"))
        huge = p.send_async(Message("big", b"x" * (4 * 1024 * 1024 + 1)))  # over max_body_size
        with pytest.raises(MessageTooLargeError):
            huge.result(timeout=30)
        assert isinstance(huge.exception(timeout=30), MessageTooLargeError) and huge.done()
        failed: list[object] = []
        huge.add_done_callback(failed.append)
        assert failed == [huge]

        async def awaited() -> None:
            await huge

        with pytest.raises(MessageTooLargeError):
            asyncio.run(awaited())


@pytest.mark.parametrize("base", BASES, ids=lambda b: b.__module__)
def test_both_batch_slot_bases_hold_batch_and_index_and_refuse_other_arguments(base):
    class Slot(base):
        __slots__ = ()

    batch = object()
    s = Slot(batch, 5)
    assert s._batch is batch and s._index == 5
    with pytest.raises(AttributeError):
        s.other = 1  # type: ignore[attr-defined]
    for args in ((batch,), (batch, 1, 2)):
        with pytest.raises(TypeError):
            Slot(*args)
    if base is not _PyBatchSlot:  # the compiled one also checks the index and keeps both read-only
        with pytest.raises(TypeError):
            Slot(batch, "5")
        with pytest.raises(AttributeError):
            s._index = 6  # type: ignore[misc]


@pytest.mark.parametrize("base", BASES, ids=lambda b: b.__module__)
def test_a_reference_cycle_through_a_send_future_is_collected(base):
    """A user's object that keeps its futures and is called back by them forms a cycle through
    the future's batch: the garbage collector must see the future's reference to its batch."""

    class Slot(base):
        __slots__ = ()

    class Batch:
        pass

    class Owner:
        pass

    owner, batch = Owner(), Batch()
    batch.callbacks = [owner]  # the batch's future keeps the owner's callback
    owner.futures = [Slot(batch, 0)]
    owner.futures[0]._track()  # (a compiled slot is born untracked: the next tests)
    gone = weakref.ref(owner)
    del owner, batch
    gc.collect()
    assert gone() is None


def _escape_by_callback(future, owner) -> None:
    owner.futures = [future]
    future.add_done_callback(owner.on_done)  # the batch's future keeps the callback


def _escape_by_raised_error(future, owner) -> None:
    keep = owner  # this frame, held by the error's traceback, keeps the owner
    try:
        future.result(timeout=0)
    except InvalidMessageError:
        pass
    del keep


def _escape_by_returned_error(future, owner) -> None:
    keep = owner
    error = future.exception(timeout=0)
    try:
        raise error
    except InvalidMessageError:
        pass
    del keep


@pytest.mark.parametrize("escape", [_escape_by_callback, _escape_by_raised_error, _escape_by_returned_error])
def test_a_send_future_is_untracked_until_a_call_can_put_it_in_a_cycle_and_such_cycles_are_collected(escape):
    """A compiled future and its batch are born untracked by the cyclic GC (a producer keeping
    20k futures paid a full collection every few thousand sends). The batch reaches user objects
    only through what the future's own calls put there: a done callback, an error raised through
    result() or returned by exception() and raised (its traceback holds the frames, and they the
    future). Each of those tracks the future and its batch first, so the cycle it makes is
    collected."""
    from equeue_core.client.producer import _OpenBatch

    class Owner:
        def on_done(self, f) -> None:
            pass

    compiled = SendFuture.__mro__[1] is not _PyBatchSlot
    batch = _OpenBatch(0)
    assert gc.is_tracked(batch) != compiled  # (a batch too: _OpenBatch)
    if escape is not _escape_by_callback:  # (a callback is kept only while the batch is unanswered)
        batch.resolve(None, InvalidMessageError("refused"))
    future, owner = SendFuture(batch, 0), Owner()
    assert gc.is_tracked(future) != compiled
    escape(future, owner)
    assert gc.is_tracked(future) and gc.is_tracked(batch)
    gone = weakref.ref(owner)
    del owner, future, batch
    gc.collect()
    assert gone() is None, "a cycle through the future was not collected"


def test_a_batch_that_fails_is_tracked_again_so_a_cycle_through_its_error_is_collected():
    """A batch's error raised where the batch is a local (the producer's own send paths) holds
    that frame in its traceback, and the frame holds the batch: a cycle through the batch alone,
    which the collector sees because resolve() tracks a failed batch again."""
    from equeue_core.client.producer import _OpenBatch

    class Owner:
        pass

    def fail(batch: _OpenBatch, owner: Owner) -> None:
        keep = owner  # noqa: F841 (held by the frame the traceback keeps)
        try:
            raise InvalidMessageError("refused")
        except InvalidMessageError as e:
            batch.resolve(None, e)

    batch, owner = _OpenBatch(0), Owner()
    fail(batch, owner)
    assert gc.is_tracked(batch)
    gone = weakref.ref(owner)
    del batch, owner
    gc.collect()
    assert gone() is None, "a cycle through a failed batch was not collected"


def test_futures_a_producer_keeps_are_left_out_of_collections_until_they_escape(file_broker):
    with Producer(file_broker.address) as p:
        p.send(Message("fut", b"warm-up"))
        futures = [p.send_async(Message("fut", b"m")) for _ in range(100)]
        assert all(f.result(timeout=30).topic == "fut" for f in futures)
        if record.native is not None:  # nor their batches and answers
            assert not any(gc.is_tracked(o) for f in futures for o in (f, f._batch, f._batch.answer))
            futures[0].add_done_callback(lambda f: None)
            assert gc.is_tracked(futures[0]) and not gc.is_tracked(futures[-1])


def test_send_future_is_made_on_the_compiled_base_when_the_hot_path_is_built():
    assert issubclass(SendFuture, record.native.BatchSlot if record.native is not None else _PyBatchSlot)


@pytest.mark.parametrize("base", BASES, ids=lambda b: b.__module__)
def test_result_of_an_answered_batch_is_the_same_send_result_from_both_bases(base):
    """The compiled BatchSlot.result builds the SendResult itself once the batch is answered; it
    must equal the Python version's, field for field, for every message of the batch, and hand
    waiting, errors and odd arguments to the Python version."""
    from equeue_core.client.message import SendResult
    from equeue_core.client.producer import _BatchAnswer, _OpenBatch, _python_result
    from equeue_core.errors import InvalidMessageError

    class Slot(base):
        __slots__ = ()

    batch = _OpenBatch(2)
    batch.resolve(_BatchAnswer("topic", 2, "AB", 40, [100, 200, 300], "broker-a"), None)
    got = [Slot(batch, i).result() for i in range(3)] + [Slot(batch, 1).result(timeout=1)]
    want = [_python_result(Slot(batch, i)) for i in (0, 1, 2, 1)]
    assert got == want
    assert got[1] == SendResult("AB00000000000000C8", "topic", 2, 41, "broker-a")
    assert all(type(r) is SendResult for r in got)
    for args, kwargs in (((1, 2), {}), ((), {"other": 1}), ((1,), {"timeout": 1})):
        with pytest.raises(TypeError):
            Slot(batch, 0).result(*args, **kwargs)
    failed = _OpenBatch(0)
    failed.resolve(None, InvalidMessageError("refused"))
    with pytest.raises(InvalidMessageError, match="refused"):
        Slot(failed, 0).result()
    pending = _OpenBatch(0)
    with pytest.raises(concurrent.futures.TimeoutError):
        Slot(pending, 0).result(timeout=0.01)


def test_send_results_are_frozen_and_the_compiled_path_leaves_them_to_reference_counting():
    """A send_batch of 1000 made 1000 SendResults at once, over the young generation's 700: a
    collection in every call, its results promoted, full collections after. A SendResult is frozen
    and holds only strs and ints, so it can be in no reference cycle: the compiled path makes
    them untracked by the cyclic GC (the same values as the Python path)."""
    import dataclasses
    import gc

    from equeue_core.client import producer
    from equeue_core.client.message import SendResult
    from equeue_core.client.producer import _BatchAnswer, _OpenBatch

    answer = _BatchAnswer("topic", 2, "AB", 40, [100, 200, 300], "broker-a")
    results = answer.results()
    assert results == [SendResult(f"AB{p:016X}", "topic", 2, 40 + i, "broker-a") for i, p in enumerate((100, 200, 300))]
    with pytest.raises(dataclasses.FrozenInstanceError):
        results[0].queue_offset = 7
    if producer._native_send_results is not None:
        assert not any(gc.is_tracked(r) for r in results)
        batch = _OpenBatch(2)
        batch.resolve(answer, None)
        assert not gc.is_tracked(producer.SendFuture(batch, 1).result())
