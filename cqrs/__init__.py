"""CQRS on EQueue (the ENode mailbox design): see docs/cqrs.md."""
