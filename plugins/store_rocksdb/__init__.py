"""RocksDB store plugin (rocksdict): commit log, queue index and offsets as column families of
one RocksDB database. See docs/stores.md for the on-disk layout and when to pick it.
"""
