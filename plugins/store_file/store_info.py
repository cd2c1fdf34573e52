"""store.json: the parameters a reader needs to do the arithmetic (chunk size, index file size).

Written once when a data directory is created; a later open keeps the stored values (changing the
chunk size of existing files would break position -> chunk arithmetic) and warns if config differs.
"""

from __future__ import annotations

import json
import os
from typing import Any

from equeue_core.errors import StoreError

from .constants import FORMAT_NAME, FORMAT_VERSION, STORE_INFO


def load_store_info(data_dir: str) -> dict[str, Any] | None:
    """The stored parameters, or None for a directory the file store never wrote."""
    try:
        with open(os.path.join(data_dir, STORE_INFO)) as f:
            info = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise StoreError(f"{STORE_INFO} in {data_dir} is not valid JSON: {e}") from e
    if info.get("format") != FORMAT_NAME or int(info.get("version", 0)) > FORMAT_VERSION:
        raise StoreError(f"{data_dir} holds format {info.get('format')!r} v{info.get('version')}, "
                         f"this is {FORMAT_NAME} v{FORMAT_VERSION}")
    return info


def write_store_info(data_dir: str, chunk_size: int, index_file_entries: int) -> None:
    """Atomically write store.json (temp file, fsync, rename, fsync the directory)."""
    from .atomic import write_atomic

    body = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "chunk_size": chunk_size,
                       "index_file_entries": index_file_entries}, indent=1).encode()
    write_atomic(os.path.join(data_dir, STORE_INFO), body)
