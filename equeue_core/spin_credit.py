"""SpinCredit: whether a spin (a wait that keeps the CPU running instead of sleeping, so nothing
has to wake a halted vCPU when what it waits for comes) still pays.

A spin that caught what it waited for earns a credit (up to CREDIT_MAX); one that ran out costs
MISS_COST. At zero credit spinning stops, and after RETRY_AFTER more chances it is tried again
with one credit. So a spin that catches at least one time in five stays on, and one that does not
costs a single window every RETRY_AFTER chances. The client's answer spin
(plugins/transport_tcp/blocking.py) and the broker's busy polling (broker/busy_poll.py) both
follow it.
"""

from __future__ import annotations

CREDIT_MAX = 16
MISS_COST = 4
RETRY_AFTER = 64


class SpinCredit:
    """One spinner's credit (not thread-safe: one per connection, or per event loop)."""

    __slots__ = ("credit", "_rest")

    def __init__(self) -> None:
        self.credit = CREDIT_MAX
        self._rest = 0  # chances let pass since the credit ran out

    def allows(self) -> bool:
        """Whether to spin this time (each False is one of the RETRY_AFTER chances let pass)."""
        if self.credit > 0:
            return True
        self._rest += 1
        if self._rest < RETRY_AFTER:
            return False
        self._rest = 0
        self.credit = 1
        return True

    def caught(self) -> None:
        if self.credit < CREDIT_MAX:
            self.credit += 1

    def missed(self) -> None:
        self.credit -= MISS_COST
