"""chunk_size is checked against the largest frame: a batch never spans chunks, so a chunk smaller
than max_frame_size would refuse a frame-sized batch forever. The store refuses to open instead,
with one line naming both settings; the broker CLI prints it without a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from equeue_plugins.store_file.queue_index import FileQueueIndex
from equeue_plugins.store_file.store import FileMessageStore

from equeue_core.contracts import StoreSettings
from equeue_core.errors import ConfigError
from tests.helpers.broker import free_port

from .helpers import open_store


def test_chunk_smaller_than_the_largest_frame_is_refused_at_open(tmp_path) -> None:
    s = StoreSettings(str(tmp_path), options={"chunk_size": 65536}, max_batch_bytes=1 << 20)
    with pytest.raises(ConfigError, match=r"chunk_size 65536 .* too small for max_frame_size 1048576"):
        FileMessageStore(s, FileQueueIndex(s))
    ok = StoreSettings(str(tmp_path / "ok"), options={"chunk_size": 65536}, max_batch_bytes=65536 - 8)
    store = FileMessageStore(ok, FileQueueIndex(ok))
    store.open()
    store.close()


def test_stored_chunk_size_is_checked_too(tmp_path) -> None:
    store, _ = open_store(tmp_path)  # 64 KiB chunks, recorded in store.json
    store.close()
    s = StoreSettings(str(tmp_path), options={}, max_batch_bytes=16 << 20)
    with pytest.raises(ConfigError, match="store.json"):
        FileMessageStore(s, FileQueueIndex(s))


def test_broker_with_a_chunk_smaller_than_max_frame_size_exits_with_one_line(tmp_path) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text("[store_options.file]\nchunk_size = 65536\n")
    proc = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "broker", "--data-dir",
                           str(tmp_path / "data"), "--host", "127.0.0.1", "--port", str(free_port()),
                           "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith("equeue: chunk_size 65536") and "max_frame_size 16777216" in lines[0]
