"""On-disk constants of the file store. docs/format.md is the reference; this module is its code.

Change nothing here without changing docs/format.md (and FORMAT_VERSION when old files stop
reading the same way).
"""

from __future__ import annotations

import struct

FORMAT_NAME = "equeue-file"
FORMAT_VERSION = 1

# ---------------------------------------------------------------- layout of the data directory
COMMITLOG_DIR = "commitlog"       # <data_dir>/commitlog/<20-digit start position>
INDEX_DIR = "index"               # <data_dir>/index/<topic>/<queue_id>/<20-digit first queue offset>
STORE_INFO = "store.json"         # {"format", "version", "chunk_size", "index_file_entries"}
CHECKPOINT = "checkpoint"         # CHECKPOINT_STRUCT, replaced atomically
ABORT = "abort"                   # exists while a writer has the store open
LOCK = "lock"                     # flock'ed by the one writer while the store is open
OFFSETS = "offsets.json"          # consumer offsets' snapshot (+ broker metadata of older stores), replaced atomically;
                                  # offsets.<generation>.log continues it (offsets_log.py)
META_DIR = "meta"                 # <data_dir>/meta/<key>: one broker metadata value each, replaced atomically
NAME_DIGITS = 20                  # file names are zero-padded decimal numbers

# ---------------------------------------------------------------- commit log
DEFAULT_CHUNK_SIZE = 256 * 1024 * 1024
MIN_CHUNK_SIZE = 4096

# End-of-chunk marker: written right after the last record of a chunk when the writer rolls to
# the next chunk. It looks like a record header whose size field is 0 (never a valid record size)
# followed by the record magic/version and the two bytes "EC". Every chunk but the newest ends
# with exactly one marker, because the writer rolls whenever a batch does not fit in
# chunk_size - END_OF_CHUNK_SIZE bytes.
END_OF_CHUNK = struct.pack("<IBBH", 0, 0xE7, 1, 0x4345)
END_OF_CHUNK_SIZE = len(END_OF_CHUNK)  # 8

# The chunk being written is kept up to this many bytes longer than its records (zero bytes,
# sparse): an append then changes no file length, so the fdatasync that makes it durable writes
# the data and not the inode as well (on this project's ext4, 120-130 us an fdatasync instead of
# 180-230; docs/benchmarks.md, "flush=sync: the chunk's length set ahead of its records").
LENGTH_AHEAD = 4 * 1024 * 1024

# ---------------------------------------------------------------- queue index
DEFAULT_INDEX_FILE_ENTRIES = 1 << 20   # 1,048,576 entries of 20 bytes = 20 MiB per index file

# ---------------------------------------------------------------- checkpoint
# magic "EQCP", version u16, flags u16, log end position u64, crc32c of the preceding 16 bytes.
CHECKPOINT_MAGIC = 0x50435145  # b"EQCP" little-endian
CHECKPOINT_STRUCT = struct.Struct("<IHHQI")
CHECKPOINT_SIZE = CHECKPOINT_STRUCT.size  # 20

# ---------------------------------------------------------------- read caches
DEFAULT_RING_BYTES = 64 * 1024 * 1024   # in-memory ring of the newest commit-log bytes
RING_PAGE = 64 * 1024                   # ring slots: each remembers which position page it holds
DEFAULT_MAP_LOW_BYTES = 1 << 30         # above this, chunks idle for MAP_IDLE_SECONDS are unmapped
DEFAULT_MAP_HIGH_BYTES = 4 << 30        # above this, no new chunk is mapped (reads use pread)
MAP_IDLE_SECONDS = 5.0
CHECKPOINT_EVERY_SECONDS = 1.0          # the checkpointer thread rewrites the checkpoint this often


def file_name(number: int) -> str:
    """The zero-padded 20-digit decimal name of a chunk or index file."""
    return f"{number:0{NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """The number a chunk/index file name stands for, or None for anything else (temp files...)."""
    if len(name) == NAME_DIGITS and name.isdigit():
        return int(name)
    return None
