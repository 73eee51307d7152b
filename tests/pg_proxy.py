"""A loopback TCP proxy to the test PostgreSQL server that can go silent (issue 32, item 1): ``stall()`` stops
forwarding in both directions while every connection stays open, as a stalled proxy or pooler does (TCP keepalives
and ``tcp_user_timeout`` see a healthy peer).  Only 127.0.0.1 is used; every loop is bounded by ``close()``."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class StallingProxy:
    """``StallingProxy(port)`` listens on 127.0.0.1 (``.port``) and forwards to ``127.0.0.1:port``."""

    def __init__(self, target_port: int):
        self._target = int(target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.stalled = threading.Event()
        self._closed = threading.Event()
        self._sockets: list = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def stall(self) -> None:
        """Stop forwarding (both ways, every connection, new ones too); keep every socket open."""
        self.stalled.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target), timeout=5)
            except OSError:
                client.close()
                continue
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, src, dst) -> None:
        while not self._closed.is_set():
            if self.stalled.is_set():
                self._closed.wait(0.05)
                continue
            try:
                ready, _, _ = select.select([src], [], [], 0.05)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
