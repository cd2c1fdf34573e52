"""TransferSaga: the process manager that runs a transfer across two accounts.

It is an ordinary projection on the events topic that answers events with commands (sent without
waiting: `CommandBus.send_async`). It keeps no state of its own: each event carries what the next
step needs. Its command ids are derived from the transfer id and the step, so when an event comes
twice (at least once delivery) the step's command is a duplicate the processor answers from the
stored result: money moves once.

    TransferStarted         -> DebitForTransfer(source)          id <transfer>.debit
    TransferDebited         -> CreditForTransfer(target)         id <transfer>.credit
    TransferDebitRejected   -> CancelTransfer                    id <transfer>.cancel
    TransferCredited        -> CompleteTransfer                  id <transfer>.complete
    TransferCreditRejected  -> RefundTransfer(source)  (compensation)  id <transfer>.refund
    TransferRefunded        -> CancelTransfer                    id <transfer>.cancel
"""

from __future__ import annotations

from equeue_cqrs import CommandBus, EventMeta, Projection, event_handler

from . import domain as d


class TransferSaga(Projection):
    def __init__(self, bus: CommandBus) -> None:
        super().__init__()
        self.bus = bus

    def claim(self, event_id: str) -> bool:
        return True  # idempotent through command ids, so no memory of event ids is needed

    @event_handler(d.TransferStarted)
    def _started(self, e: d.TransferStarted, meta: EventMeta) -> None:
        tid = meta.aggregate_id
        self.bus.send_async(d.DebitForTransfer(aggregate_id=e.source, transfer_id=tid, target=e.target,
                                               amount=e.amount, command_id=f"{tid}.debit"))

    @event_handler(d.TransferDebited)
    def _debited(self, e: d.TransferDebited, meta: EventMeta) -> None:
        tid = e.transfer_id
        self.bus.send_async(d.CreditForTransfer(aggregate_id=e.target, transfer_id=tid, source=meta.aggregate_id,
                                                amount=e.amount, command_id=f"{tid}.credit"))

    @event_handler(d.TransferDebitRejected)
    def _debit_rejected(self, e: d.TransferDebitRejected, meta: EventMeta) -> None:
        self.bus.send_async(d.CancelTransfer(aggregate_id=e.transfer_id, reason=e.reason,
                                             command_id=f"{e.transfer_id}.cancel"))

    @event_handler(d.TransferCredited)
    def _credited(self, e: d.TransferCredited, meta: EventMeta) -> None:
        self.bus.send_async(d.CompleteTransfer(aggregate_id=e.transfer_id, command_id=f"{e.transfer_id}.complete"))

    @event_handler(d.TransferCreditRejected)
    def _credit_rejected(self, e: d.TransferCreditRejected, meta: EventMeta) -> None:
        self.bus.send_async(d.RefundTransfer(aggregate_id=e.source, transfer_id=e.transfer_id, amount=e.amount,
                                             command_id=f"{e.transfer_id}.refund"))

    @event_handler(d.TransferRefunded)
    def _refunded(self, e: d.TransferRefunded, meta: EventMeta) -> None:
        self.bus.send_async(d.CancelTransfer(aggregate_id=e.transfer_id, reason="credit rejected, refunded",
                                             command_id=f"{e.transfer_id}.cancel"))
