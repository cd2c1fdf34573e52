"""LMDB event store (equeue_cqrs): one environment, many processes may append (LMDB's writer lock)."""
