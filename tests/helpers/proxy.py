"""A TCP proxy on 127.0.0.1 that a test can cut: the client behind it loses its connection the way
a network failure takes it (the broker sees the socket close), while everything else keeps
talking to the broker directly. It can also hold each answer back (`answer_delay`), a broker
that answers late as a far one does, or renumber request codes on their way to the broker
(`renumber`: a broker of an older release, which answers a code it does not know with
unknown_request). Threads, plain sockets; close() reaps them all."""

from __future__ import annotations

import socket
import struct
import threading
import time


class CuttableProxy:
    def __init__(self, upstream_port: int, answer_delay: float = 0.0,
                 renumber: dict[int, int] | None = None) -> None:
        self.upstream_port = upstream_port
        self.answer_delay = answer_delay  # seconds each read from the broker waits before it goes on
        self.renumber = dict(renumber or {})  # request code -> the code the broker gets instead
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepting = True
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            with self._lock:
                if not self._accepting:
                    client.close()
                    continue
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
                upstream.settimeout(None)
                self._sockets += [client, upstream]
                for a, b, delay, renumber in ((client, upstream, 0.0, self.renumber),
                                              (upstream, client, self.answer_delay, None)):
                    t = threading.Thread(target=self._pump, args=(a, b, delay, renumber), daemon=True)
                    self._threads.append(t)
                    t.start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float, renumber: dict[int, int] | None) -> None:
        pending = bytearray()  # with renumber: what came of a frame not whole yet
        try:
            while data := src.recv(65536):
                if delay:
                    time.sleep(delay)
                if renumber:
                    pending += data
                    data = CuttableProxy._whole_frames(pending, renumber)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _whole_frames(pending: bytearray, renumber: dict[int, int]) -> bytes:
        """Take the whole frames off the front of `pending` (docs/protocol.md, "Frame layout":
        a u32 length, then the head with the u16 code at byte 6), their codes renumbered."""
        out = bytearray()
        while len(pending) >= 8:
            size = 4 + struct.unpack_from("<I", pending)[0]
            if len(pending) < size:
                break
            frame = pending[:size]
            code = struct.unpack_from("<H", frame, 6)[0]
            if code in renumber:
                struct.pack_into("<H", frame, 6, renumber[code])
            out += frame
            del pending[:size]
        return bytes(out)

    def cut(self) -> None:
        """Drop every connection through the proxy and refuse new ones from now on."""
        self.drop(refuse_new=True)

    def drop(self, refuse_new: bool = False) -> None:
        """Drop every connection through the proxy; new ones are let through (a blip) unless
        `refuse_new` (an outage)."""
        with self._lock:
            if refuse_new:
                self._accepting = False
            for s in self._sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._sockets.clear()

    def close(self) -> None:
        self.cut()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        self._acceptor.join(10)
        for t in self._threads:
            t.join(10)
