"""An idle connection (a few small requests, then nothing) holds a small receive buffer: the
broker keeps one per client connection, so it is what an idle connection costs (docs/benchmarks.md:
about 15 KiB of broker RSS per idle connection)."""

from __future__ import annotations

from equeue_plugins.transport_tcp.framing import FrameReader

from equeue_core import frame as wire


def test_a_connection_that_made_small_requests_holds_at_most_16_kib():
    frames: list[wire.Frame] = []
    reader = FrameReader(wire.DEFAULT_MAX_FRAME, frames.append, lambda *a: None, lambda *a: None,
                         lambda *a: None)
    data = wire.encode_bytes(wire.Frame(1, 7, 0, {"topic": "t"}, b"x" * 100))
    for _ in range(3):
        buf = reader.get_buffer()
        buf[:len(data)] = data
        reader.feed(len(data))
    assert len(frames) == 3 and not reader.partial
    assert reader.buffered <= 16 * 1024
