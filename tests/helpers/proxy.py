"""A TCP proxy on 127.0.0.1 that a test can cut: the client behind it loses its connection the way
a network failure takes it (the broker sees the socket close), while everything else keeps
talking to the broker directly. It can also hold each answer back (`answer_delay`), a broker
that answers late as a far one does. Threads, plain sockets; close() reaps them all."""

from __future__ import annotations

import socket
import threading
import time


class CuttableProxy:
    def __init__(self, upstream_port: int, answer_delay: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.answer_delay = answer_delay  # seconds each read from the broker waits before it goes on
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
                for a, b, delay in ((client, upstream, 0.0), (upstream, client, self.answer_delay)):
                    t = threading.Thread(target=self._pump, args=(a, b, delay), daemon=True)
                    self._threads.append(t)
                    t.start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(65536):
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

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
