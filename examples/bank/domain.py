"""The bank's aggregates: Account (balance, frozen or not) and Transfer (the saga's own record).

A transfer moves money between two accounts, which are two aggregates: no command may change both,
so the TransferSaga (saga.py) runs it step by step, each step a command on one aggregate:
start -> debit the source -> credit the target -> complete; a rejected debit cancels it; a
rejected credit is compensated by refunding the source, then the transfer is cancelled. Debits and
credits carry the transfer id, and the saga's commands have ids derived from it, so a step that
runs twice is answered from the stored result instead of moving money twice.
"""

from __future__ import annotations

from equeue_cqrs import Aggregate, Command, CommandContext, DomainEvent, command_handler, event_handler


class InsufficientFundsError(Exception):
    pass


class AccountFrozenError(Exception):
    pass


# -- commands -------------------------------------------------------------------------------------

class OpenAccount(Command):
    owner: str
    initial: int = 0


class Deposit(Command):
    amount: int


class Withdraw(Command):
    amount: int


class FreezeAccount(Command):
    pass


class StartTransfer(Command):
    """aggregate_id is the transfer id."""

    source: str
    target: str
    amount: int


class DebitForTransfer(Command):
    transfer_id: str
    target: str
    amount: int


class CreditForTransfer(Command):
    transfer_id: str
    source: str
    amount: int


class RefundTransfer(Command):
    transfer_id: str
    amount: int


class CompleteTransfer(Command):
    pass


class CancelTransfer(Command):
    reason: str


# -- events ---------------------------------------------------------------------------------------

class AccountOpened(DomainEvent):
    owner: str
    initial: int


class Deposited(DomainEvent):
    amount: int


class Withdrawn(DomainEvent):
    amount: int


class AccountFrozen(DomainEvent):
    pass


class TransferDebited(DomainEvent):
    transfer_id: str
    target: str
    amount: int


class TransferDebitRejected(DomainEvent):
    transfer_id: str
    reason: str


class TransferCredited(DomainEvent):
    transfer_id: str
    source: str
    amount: int


class TransferCreditRejected(DomainEvent):
    transfer_id: str
    source: str
    amount: int
    reason: str


class TransferRefunded(DomainEvent):
    transfer_id: str
    amount: int


class TransferStarted(DomainEvent):
    source: str
    target: str
    amount: int


class TransferCompleted(DomainEvent):
    pass


class TransferCancelled(DomainEvent):
    reason: str


# -- aggregates -----------------------------------------------------------------------------------

class Account(Aggregate):
    owner = ""
    balance = 0
    frozen = False

    @classmethod
    def open(cls, account_id: str, owner: str, initial: int) -> Account:
        if initial < 0:
            raise ValueError("an account opens with a non-negative balance")
        account = cls(account_id)
        account.raise_event(AccountOpened(owner, initial))
        return account

    def deposit(self, amount: int) -> None:
        self._check_amount(amount)
        if self.frozen:
            raise AccountFrozenError(f"account {self.id} is frozen")
        self.raise_event(Deposited(amount))

    def withdraw(self, amount: int) -> None:
        self._check_amount(amount)
        if self.frozen:
            raise AccountFrozenError(f"account {self.id} is frozen")
        if amount > self.balance:
            raise InsufficientFundsError(f"account {self.id} has {self.balance}, not {amount}")
        self.raise_event(Withdrawn(amount))

    def freeze(self) -> None:
        if not self.frozen:
            self.raise_event(AccountFrozen())

    def debit_for_transfer(self, transfer_id: str, target: str, amount: int) -> None:
        """Never raises for a business reason: a rejection is an event the saga reacts to."""
        if self.frozen:
            self.raise_event(TransferDebitRejected(transfer_id, "source account frozen"))
        elif amount > self.balance:
            self.raise_event(TransferDebitRejected(transfer_id, "insufficient funds"))
        else:
            self.raise_event(TransferDebited(transfer_id, target, amount))

    def credit_for_transfer(self, transfer_id: str, source: str, amount: int) -> None:
        if self.frozen:
            self.raise_event(TransferCreditRejected(transfer_id, source, amount, "target account frozen"))
        else:
            self.raise_event(TransferCredited(transfer_id, source, amount))

    def refund_transfer(self, transfer_id: str, amount: int) -> None:
        """Compensation: always accepted, frozen or not (the money was taken from here)."""
        self.raise_event(TransferRefunded(transfer_id, amount))

    @staticmethod
    def _check_amount(amount: int) -> None:
        if amount <= 0:
            raise ValueError(f"amount must be positive, not {amount}")

    @event_handler(AccountOpened)
    def _opened(self, e: AccountOpened) -> None:
        self.owner, self.balance, self.frozen = e.owner, e.initial, False

    @event_handler(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount

    @event_handler(Withdrawn)
    def _withdrawn(self, e: Withdrawn) -> None:
        self.balance -= e.amount

    @event_handler(AccountFrozen)
    def _frozen(self, e: AccountFrozen) -> None:
        self.frozen = True

    @event_handler(TransferDebited)
    def _debited(self, e: TransferDebited) -> None:
        self.balance -= e.amount

    @event_handler(TransferDebitRejected)
    def _debit_rejected(self, e: TransferDebitRejected) -> None:
        pass

    @event_handler(TransferCredited)
    def _credited(self, e: TransferCredited) -> None:
        self.balance += e.amount

    @event_handler(TransferCreditRejected)
    def _credit_rejected(self, e: TransferCreditRejected) -> None:
        pass

    @event_handler(TransferRefunded)
    def _refunded(self, e: TransferRefunded) -> None:
        self.balance += e.amount


class Transfer(Aggregate):
    source = ""
    target = ""
    amount = 0
    status = ""

    @classmethod
    def start(cls, transfer_id: str, source: str, target: str, amount: int) -> Transfer:
        if amount <= 0 or source == target:
            raise ValueError("a transfer moves a positive amount between two different accounts")
        transfer = cls(transfer_id)
        transfer.raise_event(TransferStarted(source, target, amount))
        return transfer

    def complete(self) -> None:
        if self.status == "started":
            self.raise_event(TransferCompleted())

    def cancel(self, reason: str) -> None:
        if self.status == "started":
            self.raise_event(TransferCancelled(reason))

    @event_handler(TransferStarted)
    def _started(self, e: TransferStarted) -> None:
        self.source, self.target, self.amount, self.status = e.source, e.target, e.amount, "started"

    @event_handler(TransferCompleted)
    def _completed(self, e: TransferCompleted) -> None:
        self.status = "completed"

    @event_handler(TransferCancelled)
    def _cancelled(self, e: TransferCancelled) -> None:
        self.status = "cancelled"


# -- command handlers -------------------------------------------------------------------------------

@command_handler
def open_account(ctx: CommandContext, c: OpenAccount) -> None:
    ctx.add(Account.open(c.aggregate_id, c.owner, c.initial))


@command_handler
def deposit(ctx: CommandContext, c: Deposit) -> None:
    ctx.get(Account).deposit(c.amount)


@command_handler
def withdraw(ctx: CommandContext, c: Withdraw) -> None:
    ctx.get(Account).withdraw(c.amount)


@command_handler
def freeze_account(ctx: CommandContext, c: FreezeAccount) -> None:
    ctx.get(Account).freeze()


@command_handler
def start_transfer(ctx: CommandContext, c: StartTransfer) -> None:
    ctx.add(Transfer.start(c.aggregate_id, c.source, c.target, c.amount))


@command_handler
def debit_for_transfer(ctx: CommandContext, c: DebitForTransfer) -> None:
    ctx.get(Account).debit_for_transfer(c.transfer_id, c.target, c.amount)


@command_handler
def credit_for_transfer(ctx: CommandContext, c: CreditForTransfer) -> None:
    ctx.get(Account).credit_for_transfer(c.transfer_id, c.source, c.amount)


@command_handler
def refund_transfer(ctx: CommandContext, c: RefundTransfer) -> None:
    ctx.get(Account).refund_transfer(c.transfer_id, c.amount)


@command_handler
def complete_transfer(ctx: CommandContext, c: CompleteTransfer) -> None:
    ctx.get(Transfer).complete()


@command_handler
def cancel_transfer(ctx: CommandContext, c: CancelTransfer) -> None:
    ctx.get(Transfer).cancel(c.reason)
