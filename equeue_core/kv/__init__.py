"""A helper library for store plugins built on an ordered key-value engine (LMDB, RocksDB, ...).

It owns no storage: it lays out keys (keys.py), cuts a stamped batch into chunk values
(chunks.py), and answers pulls, time and position searches and exports over two lookups the
engine supplies inside one snapshot (queries.py). Both built-in KV stores use it, so a new
engine needs only its transactions and its flush.
"""
