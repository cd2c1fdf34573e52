"""The bank example: accounts, deposits, withdrawals and transfers as a saga, on equeue_cqrs.
Run it with `.venv/bin/python -m examples.bank` (see README.md)."""
