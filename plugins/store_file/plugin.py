"""The file store plugin: chunked commit log + per-queue index files + offsets file (the default).

Registered under the name "file" for every storage hook. docs/format.md documents the bytes.
"""

from __future__ import annotations

from typing import Any

from equeue_core.contracts import QueueIndex, StoreSettings
from equeue_core.hookspecs import hookimpl

from .offsets import FileOffsetStore
from .queue_index import FileQueueIndex
from .reader import FileStoreReader
from .store import FileMessageStore


def make_queue_index(settings: StoreSettings) -> FileQueueIndex:
    return FileQueueIndex(settings)


def make_message_store(settings: StoreSettings, index: QueueIndex) -> FileMessageStore:
    return FileMessageStore(settings, index)


def make_offset_store(settings: StoreSettings) -> FileOffsetStore:
    return FileOffsetStore(settings)


def make_store_reader(path: str, options: dict[str, str]) -> FileStoreReader:
    return FileStoreReader(path, options)


@hookimpl
def equeue_message_stores() -> dict[str, Any]:
    return {"file": make_message_store}


@hookimpl
def equeue_queue_indexes() -> dict[str, Any]:
    return {"file": make_queue_index}


@hookimpl
def equeue_offset_stores() -> dict[str, Any]:
    return {"file": make_offset_store}


@hookimpl
def equeue_store_readers() -> dict[str, Any]:
    return {"file": make_store_reader}
