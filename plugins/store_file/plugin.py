"""The file store plugin: chunked commit log + per-queue index files + offsets file (the default).

Registered under the name "file" as a store engine and a store reader. docs/format.md documents
the bytes.
"""

from __future__ import annotations

from typing import Any

from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall


@hookimpl
def equeue_store_engines() -> dict[str, Any]:
    return {"file": ImportOnCall("equeue_plugins.store_file.engine:FileEngine")}


@hookimpl
def equeue_store_readers() -> dict[str, Any]:
    return {"file": ImportOnCall("equeue_plugins.store_file.reader:FileStoreReader")}
