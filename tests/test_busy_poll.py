"""The broker's busy polling (equeue_core/broker/busy_poll.py): after a request the event loop keeps
polling for a window, yielding the CPU each turn, and only while that catches requests.

The policy on a real event loop (its clock is the real one; windows are chosen far from the
loop's turn times so the outcome does not depend on the machine's speed), then a real broker
process: back-to-back sends are caught, paced sends turn it off, and 0 turns it off entirely."""

from __future__ import annotations

import asyncio
import time

import pytest

from equeue_core.broker.busy_poll import BusyPoll
from equeue_core.client import AdminClient, Message, Producer
from equeue_core.config import Config, validate
from equeue_core.errors import ConfigError
from equeue_core.spin_credit import CREDIT_MAX, MISS_COST, RETRY_AFTER
from tests.helpers.broker import BrokerProcess


def _counting(poll: BusyPoll) -> list[int]:
    """Count the spin's turns (each yields the CPU once)."""
    turns = [0]

    def give_way() -> None:
        turns[0] += 1

    poll._give_way = give_way
    return turns


def test_a_request_keeps_the_loop_turning_for_the_window_then_it_is_a_miss():
    async def main():
        poll = BusyPoll(asyncio.get_running_loop(), 0.02)
        turns = _counting(poll)
        started = time.perf_counter()
        poll.poke()
        deadline = time.monotonic() + 10
        while poll.missed == 0:
            assert time.monotonic() < deadline, "the window never ran out"
            await asyncio.sleep(0)
        return poll, turns[0], time.perf_counter() - started

    poll, turns, took = asyncio.run(main())
    assert took >= 0.02
    assert turns > 1  # the loop went round and round (a turn is one non-blocking poll)
    assert (poll.spins, poll.caught, poll.missed) == (1, 0, 1)
    assert poll.spin_credit.credit == CREDIT_MAX - MISS_COST
    assert poll.spin_s >= 0.02


def test_requests_during_a_spin_are_caught_and_keep_it_open():
    async def main():
        poll = BusyPoll(asyncio.get_running_loop(), 0.05)
        poll.spin_credit.credit = 3
        poll.poke()
        for _ in range(5):  # well inside each new window
            await asyncio.sleep(0.005)
            poll.poke()
        assert poll.missed == 0
        deadline = time.monotonic() + 10
        while poll.missed == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        return poll

    poll = asyncio.run(main())
    assert (poll.spins, poll.caught, poll.missed) == (1, 5, 1)
    assert poll.spin_credit.credit == 3 + 5 - MISS_COST


def test_the_window_opens_when_the_requests_work_is_done_not_when_it_arrived():
    """The window is the wait for the client's next request: a request whose work takes longer
    than the window (here the loop is held 0.3 s, the window is 0.2 s) still leaves the whole
    window for the next one, which comes 0.05 s after the work."""
    async def main():
        poll = BusyPoll(asyncio.get_running_loop(), 0.2)
        poll.poke()
        time.sleep(0.3)  # the request's own work, on the loop
        await asyncio.sleep(0.05)  # the client's turnaround
        caught_in_time = poll.missed == 0
        poll.poke()
        deadline = time.monotonic() + 10
        while poll.missed == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        return poll, caught_in_time

    poll, caught_in_time = asyncio.run(main())
    assert caught_in_time, "the window ran out during the request's own work"
    assert (poll.spins, poll.caught, poll.missed) == (1, 1, 1)


def test_misses_turn_it_off_and_it_tries_again_after_retry_after_requests():
    async def main():
        poll = BusyPoll(asyncio.get_running_loop(), 1e-6)  # runs out before the loop's next turn
        for _ in range(CREDIT_MAX // MISS_COST):
            poll.poke()
            while poll._spinning:
                await asyncio.sleep(0)
        assert poll.spin_credit.credit == 0 and poll.spins == CREDIT_MAX // MISS_COST
        for _ in range(RETRY_AFTER - 1):
            poll.poke()  # off: no window opens
            await asyncio.sleep(0)
        assert poll.spins == CREDIT_MAX // MISS_COST
        poll.poke()  # the RETRY_AFTER-th request tries once more, with one credit
        assert poll.spins == CREDIT_MAX // MISS_COST + 1
        while poll._spinning:
            await asyncio.sleep(0)
        return poll

    poll = asyncio.run(main())
    assert poll.spin_credit.credit == 1 - MISS_COST


def test_a_window_of_zero_never_spins():
    async def main():
        poll = BusyPoll(asyncio.get_running_loop(), 0.0)
        for _ in range(10):
            poll.poke()
            await asyncio.sleep(0)
        return poll

    poll = asyncio.run(main())
    assert (poll.spins, poll.caught, poll.missed) == (0, 0, 0)
    assert BusyPoll(None, 0.05).window == 0.0  # no loop yet (a broker before start): off


def test_config_bounds():
    assert validate(Config()).busy_poll_us == 50
    for bad in (-1, 10_001):
        with pytest.raises(ConfigError, match="busy_poll_us"):
            validate(Config(busy_poll_us=bad))


def _busy_poll_stats(address: str) -> dict:
    with AdminClient(address) as admin:
        return admin.stats()["busy_poll"]


@pytest.mark.parametrize("window_us", [10_000, 0])
def test_a_broker_catches_back_to_back_sends_and_0_turns_it_off(tmp_path, window_us):
    """A 10 ms window (the most the config allows, far longer than a send's round trip on any machine) catches every send
    after the first of a back-to-back run; with 0 the broker never spins."""
    b = BrokerProcess(tmp_path / "d", env={"EQUEUE_BUSY_POLL_US": str(window_us)}).start()
    try:
        with Producer(b.address) as p:
            for i in range(200):
                p.send(Message("bp", b"x%d" % i))
        stats = _busy_poll_stats(b.address)
        assert stats["window_us"] == window_us
        if window_us:
            assert stats["caught"] >= 150, stats
            assert stats["credit"] == CREDIT_MAX, stats
        else:
            assert (stats["spins"], stats["caught"], stats["missed"]) == (0, 0, 0), stats
    finally:
        b.stop()


def test_a_broker_stops_spinning_for_sends_further_apart_than_its_window(tmp_path):
    """Sends 30 ms apart against a 2 ms window: each window runs out, and after CREDIT_MAX /
    MISS_COST misses the broker stops opening them (it would try again after RETRY_AFTER
    requests, more than this run makes)."""
    b = BrokerProcess(tmp_path / "d", env={"EQUEUE_BUSY_POLL_US": "2000"}).start()
    try:
        with Producer(b.address) as p:
            p.send(Message("paced", b"first"))
            before = _busy_poll_stats(b.address)
            for i in range(12):
                time.sleep(0.03)
                p.send(Message("paced", b"x%d" % i))
        after = _busy_poll_stats(b.address)
        assert after["credit"] <= 0, (before, after)
        assert after["spins"] <= CREDIT_MAX // MISS_COST + 1, (before, after)  # not one per send
        assert after["missed"] >= CREDIT_MAX // MISS_COST, (before, after)
    finally:
        b.stop()
