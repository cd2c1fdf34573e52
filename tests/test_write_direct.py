"""The tcp transport's large flushes with the GIL released (plugins/transport_tcp/framing.py,
WriteCoalescer `direct`): the bytes arrive whole and in order whether the kernel takes all of a
flush, part of it (the rest queued in the transport, and what follows queued behind it) or none,
and a producer's send_async batches take that path and arrive intact."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import uvloop
from equeue_plugins.transport_tcp.framing import DIRECT_MIN_BYTES, WriteCoalescer, _after

from equeue_core.client import LitePullConsumer, Message, Producer


def test_after_gives_what_the_kernel_did_not_take():
    bufs = [b"abc", b"defg", b"h"]
    assert _after(bufs, 0) == bufs
    assert [bytes(b) for b in _after(bufs, 2)] == [b"c", b"defg", b"h"]
    assert [bytes(b) for b in _after(bufs, 3)] == [b"defg", b"h"]
    assert [bytes(b) for b in _after(bufs, 7)] == [b"h"]
    assert _after(bufs, 8) == []


async def _write_through(flushes: list[list[bytes]], room_after_first: bool) -> tuple[bytes, int, bool]:
    """Write each list of buffers with one flush to a reader thread, and return what it got and
    the bytes that went through `direct`. With `room_after_first`, the reader reads nothing until
    the first flush is done, then takes half of what the kernel took of it while the loop is
    kept from running (so the kernel has room again while the transport still holds the rest of
    the first flush), then the remaining flushes are made. Also: whether the socket was
    duplicated at all."""
    loop = asyncio.get_running_loop()
    total = sum(len(b) for f in flushes for b in f)
    got = bytearray()
    first_done, room = threading.Event(), threading.Event()
    want = [0]
    listener = socket.create_server(("127.0.0.1", 0))

    def read() -> None:
        conn, _ = listener.accept()
        with conn:
            if room_after_first:
                first_done.wait(30)
                while len(got) < want[0]:
                    got.extend(conn.recv(want[0] - len(got)))
                room.set()
            while len(got) < total:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", listener.getsockname()[1])
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    writer = WriteCoalescer(transport, loop, direct=True)
    try:
        for i, f in enumerate(flushes):
            writer.write(list(f))
            writer.flush()
            if i == 0 and room_after_first:
                want[0] = writer.direct_bytes // 2
                first_done.set()
                assert room.wait(30)  # blocks the loop: the transport cannot write meanwhile
                assert transport.get_write_buffer_size() > 0
        for _ in range(3000):
            if not reader.is_alive():
                break
            await asyncio.sleep(0.01)
        duplicated = writer.direct is not None
    finally:
        transport.close()
        writer.close_direct()
        listener.close()
        reader.join(10)
    return bytes(got), writer.direct_bytes, duplicated


def test_a_flush_larger_than_the_socket_takes_arrives_whole_and_in_order():
    # 8 MiB in the first flush (more than loopback's buffers hold while nobody reads); then, with
    # room in the kernel's buffers again but the transport still holding the rest of the first
    # flush, a small flush and a large one: both must queue behind what the transport holds
    big = [os.urandom(1 << 20) for _ in range(8)]
    small = [b"small frame"]
    large = [os.urandom(DIRECT_MIN_BYTES), os.urandom(DIRECT_MIN_BYTES)]
    got, direct_bytes, _ = uvloop.run(_write_through([big, small, large], room_after_first=True))
    assert got == b"".join(big + small + large)
    assert 0 < direct_bytes < sum(map(len, big))  # the kernel took part of the first flush only


def test_small_flushes_stay_on_the_transport_and_cost_no_second_descriptor():
    flushes = [[b"x" * 100] for _ in range(50)]
    got, direct_bytes, duplicated = uvloop.run(_write_through(flushes, room_after_first=False))
    assert got == b"x" * 5000 and direct_bytes == 0 and not duplicated


def test_send_async_batches_go_direct_and_arrive_intact(file_broker):
    bodies = [os.urandom(1024) + i.to_bytes(4, "little") for i in range(3000)]
    with Producer(file_broker.address) as p:
        futures = [p.send_async(Message("direct", b)) for b in bodies]
        for f in futures:
            f.result(30)
        # the producer's one broker connection, its tcp connection's writer
        assert p._async._conn._conn._proto.writer.direct_bytes > 0
    c = LitePullConsumer("direct-check", file_broker.address, consume_from="first")
    try:
        c.subscribe("direct")
        seen = []
        for _ in range(200):
            seen += [m.body for m in c.poll(0.5)]
            if len(seen) >= len(bodies):
                break
    finally:
        c.close()
    assert sorted(seen) == sorted(bodies)
