"""A held pull is woken inside the arrival's own call (no loop turn in between), its late answer
reaches a listening transport synchronously and is written in the appending turn, and nothing
stays registered once it is answered, timed out or cancelled (its connection gone)."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref

import pytest

from equeue_core import frame as wire
from equeue_core.broker.long_poll import HeldPull, LateAnswer, PullHold
from equeue_core.client.message import Message
from equeue_core.codes import Code, PullStatus
from equeue_core.frame import Frame
from tests.helpers.broker import BrokerProcess
from tests.test_fast_path import read_frames, send_frame


def test_an_arrival_wakes_the_held_pull_inside_notify_itself():
    hold = PullHold()
    woken: list[str] = []
    hold.park("t", 0, lambda: woken.append("a"))
    hold.park("t", 0, lambda: woken.append("b"))
    hold.park("t", 1, lambda: woken.append("other queue"))
    assert hold.held == 3
    hold.notify("t", 0)
    assert woken == ["a", "b"]  # no loop turn needed: there is no loop here at all
    assert hold.held == 1 and hold.queues() == [("t", 1)]
    hold.notify("t", 0)  # nothing held there any more: nothing to do
    assert woken == ["a", "b"]


def test_a_discarded_waker_is_forgotten_and_never_called():
    hold = PullHold()
    called: list[int] = []

    def waker() -> None:
        called.append(1)

    hold.park("t", 2, waker)
    hold.discard("t", 2, waker)
    hold.discard("t", 2, waker)  # twice is harmless
    assert hold.held == 0 and hold.queues() == []
    hold.notify("t", 2)
    assert called == []


def test_a_waker_that_parks_again_during_wake_all_waits_for_the_next_arrival():
    hold = PullHold()
    calls: list[int] = []

    def waker() -> None:  # found nothing (a tag filter): hold on
        calls.append(1)
        hold.park("t", 3, waker)

    hold.park("t", 3, waker)
    hold.wake_all()
    assert calls == [1] and hold.held == 1


def test_a_late_answer_goes_to_its_listener_at_once_and_to_an_awaiting_task_otherwise():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        listened = LateAnswer(loop)
        got: list = []
        listened.listen(got.append)
        answer = Frame(1, 7, 0, {"status": 0})
        listened.answer(answer)
        assert got == [answer]  # synchronously, inside answer()
        listened.answer(Frame(1, 7, 0, {}))  # a second answer is ignored
        assert got == [answer]

        awaited = LateAnswer(loop)
        loop.call_soon(awaited.answer, answer)
        assert await awaited is answer

        cancelled = LateAnswer(loop)
        cancelled.listen(got.append)
        cancelled.cancel()  # the connection went away
        cancelled.answer(answer)
        assert got == [answer]

    asyncio.run(main())


def _held_pull_ends(how: str) -> tuple[list, bool, PullHold]:
    """Park a HeldPull, end it `how` (an arrival, its deadline, or its connection going away) with
    the cyclic GC off, drop every reference the caller had, and report (the answer(final) calls
    it saw, whether its LateAnswer outlived that, the hold)."""
    hold = PullHold()
    calls: list = []
    answer = Frame(2, 9, 0, {"status": 0})

    def read(final: bool) -> Frame | None:
        calls.append(final)
        return answer if final or len(calls) > 1 else None  # the first arrival finds nothing

    async def main() -> weakref.ref:
        pull = HeldPull(hold, "t", 0, time.monotonic() + (0.05 if how == "deadline" else 60), read)
        late = pull.late
        given: list = []
        late.listen(given.append)
        ref = weakref.ref(late)
        if how == "arrival":
            hold.notify("t", 0)  # finds nothing: parks again
            assert hold.held == 1 and not late.done()
            hold.notify("t", 0)
            assert given == [answer]
        elif how == "deadline":
            for _ in range(200):
                if late.done():
                    break
                await asyncio.sleep(0.01)
            assert given == [answer]
        else:
            late.cancel()
            await asyncio.sleep(0)  # its done callbacks run on the next turn
        del pull, late, given
        return ref

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ref = asyncio.run(main())
        outlived = ref() is not None
    finally:
        if was_enabled:
            gc.enable()
    return calls, outlived, hold


@pytest.mark.parametrize("how", ["arrival", "deadline", "cancelled"])
def test_a_held_pull_is_freed_by_reference_counting_however_it_ends(how):
    """No reference cycle is left for the cyclic GC: at 5k msg/s the closures that held pulls were
    made of left some 25 objects per pull to it, and its collections paused the loop."""
    calls, outlived, hold = _held_pull_ends(how)
    assert not outlived
    assert hold.held == 0 and hold.queues() == []
    assert calls == {"arrival": [False, False], "deadline": [True], "cancelled": []}[how]


def _answered_at(pulls: list[tuple[float, float]], early: dict[int, float] | None = None
                 ) -> tuple[dict[int, float], list]:
    """Park a pull on queue i at pulls[i] = (seconds after the start, hold length), answer the
    pulls in `early` (queue -> seconds after the start) by an arrival, and wait for the rest to
    time out. Returns queue -> seconds from the start to its answer, and what PullHold's groups
    looked like once every pull was parked and at the end (hold ms -> pulls)."""
    hold = PullHold()
    answered: dict[int, float] = {}
    parked: dict[int, HeldPull] = {}

    async def main() -> list:
        loop = asyncio.get_running_loop()
        start = time.monotonic()

        def park(queue_id: int, seconds: float) -> None:
            pull = HeldPull(hold, "t", queue_id, time.monotonic() + seconds,
                            lambda final: Frame(2, 9, 0, {"status": 0}) if final else None)
            pull.late.listen(lambda frame: answered.setdefault(queue_id, time.monotonic() - start))
            parked[queue_id] = pull

        for queue_id, (at, seconds) in enumerate(pulls):
            loop.call_later(at, park, queue_id, seconds)
        for queue_id, at in (early or {}).items():
            loop.call_later(at, lambda q=queue_id: parked[q]._attempt(True))
        while len(parked) < len(pulls):
            await asyncio.sleep(0.001)
        groups = [hold.deadline_timers]
        for _ in range(300):
            if len(answered) == len(pulls):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(max(at + seconds for at, seconds in pulls) + 0.05)  # every timer fired again
        groups.append(hold.deadline_timers)
        return groups

    return answered, asyncio.run(main())


def test_pulls_of_several_hold_lengths_are_each_answered_at_their_own_deadline_under_one_timer_a_length():
    """Deadlines are kept per hold length, one loop timer a length (PullHold.expire_at): pulls
    parked out of deadline order are still answered in it, none before its deadline, and no
    group is left once they are."""
    holds = [0.15, 0.05, 0.10, 0.05, 0.15]
    answered, (parked, after) = _answered_at([(0.0, seconds) for seconds in holds])
    assert parked == {150: 2, 50: 2, 100: 1}
    assert after == {}
    assert sorted(answered) == list(range(len(holds)))
    for queue_id, seconds in enumerate(holds):
        assert seconds - 0.002 <= answered[queue_id] < seconds + 2.0, (queue_id, answered)
    assert answered[1] <= answered[2] <= answered[0] and answered[3] <= answered[4]


def test_a_pull_behind_one_answered_early_times_out_at_its_own_deadline():
    """Two pulls of one hold length, parked 30 ms apart: the group's timer is set for the first
    one's deadline, and that pull is answered early by an arrival. Firing, the timer must set
    itself again for the second pull, neither answering it early nor dropping it."""
    answered, (parked, after) = _answered_at([(0.0, 0.1), (0.03, 0.1)], early={0: 0.01})
    assert parked == {100: 1}  # the first was answered before the second parked: one pull left
    assert answered[0] < 0.1
    assert 0.13 - 0.002 <= answered[1] < 2.13
    assert after == {}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("held") / "data") as b:
        yield b


def _request(code: int, request_id: int, header: dict, body: bytes = b"") -> bytes:
    return wire.encode_bytes(wire.Frame(code, request_id, 0, header, body))


def test_a_held_pull_is_answered_inside_the_send_that_wakes_it(broker):
    """On one connection: a pull held on an empty queue, then a send to that queue. The pull's
    answer is written while the send is handled, so it precedes the send's own answer in the
    stream (through a task it came a loop turn or two after the send's answer)."""
    with socket.create_connection(("127.0.0.1", broker.port)) as s:
        s.sendall(_request(Code.CREATE_TOPIC, 1, {"topic": "held", "queues": 1}))
        assert not read_frames(s, 1)[0].is_error
        s.sendall(_request(Code.PULL, 2, {"group": "g", "topic": "held", "queue_id": 0, "offset": 0,
                                         "max_count": 8, "hold_ms": 30000}))
        time.sleep(0.2)  # (the order holds if both arrive in one read too)
        s.sendall(send_frame(3, "held", 0, Message("held", b"x").encode(0)))
        first, second = read_frames(s, 2)
    assert (first.request_id, second.request_id) == (2, 3)
    assert first.header["status"] == PullStatus.FOUND and first.header["count"] == 1
    assert not second.is_error


def test_a_held_pull_of_a_closed_connection_is_dropped_and_later_sends_are_fine(broker):
    with socket.create_connection(("127.0.0.1", broker.port)) as info:
        def held() -> int:
            info.sendall(_request(Code.BROKER_INFO, 9, {}))
            return read_frames(info, 1)[0].header["held_pulls"]

        with socket.create_connection(("127.0.0.1", broker.port)) as s:
            s.sendall(_request(Code.CREATE_TOPIC, 1, {"topic": "gone", "queues": 1}))
            read_frames(s, 1)
            s.sendall(_request(Code.PULL, 2, {"group": "g", "topic": "gone", "queue_id": 0, "offset": 0,
                                             "hold_ms": 30000}))
            deadline = time.monotonic() + 20
            while held() != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert held() == 1
        deadline = time.monotonic() + 20
        while held() != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held() == 0
        info.sendall(send_frame(3, "gone", 0, Message("gone", b"x").encode(0)))
        assert not read_frames(info, 1)[0].is_error
