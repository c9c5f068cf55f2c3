"""A TCP forwarder that records the bytes it forwards: what an observer of a loopback
connection sees (tests of "no secret crosses the wire in clear")."""

from __future__ import annotations

import socket
import threading


class CapturingProxy:
    """TCP forwarder on 127.0.0.1 recording every byte it forwards, in both directions."""

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # lets the accept loop notice close()
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._captured = bytearray()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        #: Connections it accepted but could not forward (the target refused or failed):
        #: the client saw its connection closed; a test failing on that says why.
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def captured(self) -> bytes:
        with self._lock:
            return bytes(self._captured)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                down, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                up = socket.create_connection(self._target, timeout=30)
                up.settimeout(None)
            except OSError as e:  # the client sees its connection closed; keep accepting
                with self._lock:
                    self.errors.append(f"connecting to the target {self._target[0]}:"
                                       f"{self._target[1]} failed: {type(e).__name__}: {e}")
                down.close()
                continue
            with self._lock:
                self._socks += [down, up]
            for src, dst in ((down, up), (up, down)):
                t = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
                self._threads.append(t)
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self._captured += data
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:  # shutdown, unlike close, wakes a pump thread blocked in recv()
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        for t in list(self._threads):
            t.join(timeout=5)
