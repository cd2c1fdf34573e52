"""LMDB store plugin: commit log, queue index and offsets in one LMDB environment.

See docs/stores.md for the on-disk layout and when to pick it.
"""
