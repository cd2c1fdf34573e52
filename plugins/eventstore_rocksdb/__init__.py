"""RocksDB event store (equeue_cqrs): one process owns the database (RocksDB's LOCK file)."""
