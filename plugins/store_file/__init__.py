"""The file store (the default): a chunked commit log, per-queue index files and consumer offsets.

docs/format.md documents the bytes. One module per job:

    constants.py    the on-disk constants, mirroring docs/format.md
    store_info.py   store.json (chunk size, index file size) so readers can do the arithmetic
    atomic.py       replace a small file atomically (temp, fsync, rename, fsync dir)
    ring.py         in-memory ring of the newest log bytes
    chunk.py        read-only, growable mmap of one chunk file
    commit_log.py   the chunked log: reserve/write/publish, roll with end-of-chunk marker, sync, delete
    queue_index.py  FileQueueIndex: 20-byte entries per queue, chunked files, pread reads
    recovery.py     checkpoint, scan/verify/truncate of the log after a crash
    store.py        FileMessageStore: append, reads, recovery orchestration, flusher, retention
    offsets.py      FileOffsetStore: offsets in a snapshot (offsets.json) and a log; metadata values in meta/
    offsets_log.py  the offsets log's records: what changed since the snapshot, one record a persist
    engine.py       FileEngine: the writer lock, then all of the above opened and closed together
    reader.py       FileStoreReader: another process's verified, read-only view + Arrow export
    plugin.py       the @hookimpl functions registering the engine and the reader as "file"
    bench.py        micro-benchmark of append/read (python -m equeue_plugins.store_file.bench)
"""
