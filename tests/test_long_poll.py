"""A held pull resumes on the loop turn right after the arrival that wakes it (no extra waiter
hop), times out with False, and leaves nothing registered either way."""

from __future__ import annotations

import asyncio

from equeue_core.broker.long_poll import PullHold


def test_an_arrival_resumes_the_held_pull_on_the_next_loop_turn():
    async def main() -> None:
        hold = PullHold()
        held = asyncio.ensure_future(hold.wait("t", 0, 30))
        await asyncio.sleep(0)  # the pull is parked now
        assert hold.held == 1
        hold.notify("t", 0)
        await asyncio.sleep(0)  # one turn of the loop
        assert held.done() and held.result() is True
        assert hold.held == 0

    asyncio.run(main())


def test_a_held_pull_times_out_with_false_and_is_forgotten():
    async def main() -> None:
        hold = PullHold()
        assert await hold.wait("t", 1, 0.01) is False
        assert hold.held == 0
        hold.notify("t", 1)  # nothing held: nothing to do

    asyncio.run(main())


def test_a_cancelled_held_pull_is_forgotten():
    async def main() -> None:
        hold = PullHold()
        held = asyncio.ensure_future(hold.wait("t", 2, 30))
        await asyncio.sleep(0)
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
        assert hold.held == 0

    asyncio.run(main())
