"""A loopback TCP proxy a test can cut (every connection dropped, new ones refused) and restore, or slow
(the target's answers held back)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class CuttableProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = False
        self.answer_delay_s = 0.0
        """Hold each chunk the target sends back this long before passing it on (0: pass at once)."""
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if answers and self.answer_delay_s:
                    time.sleep(self.answer_delay_s)
                if self.cut:
                    break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            with self._lock:
                for s in self._open:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                self._open.clear()

    def close(self) -> None:
        self._stop = True
        self.set_cut(True)
        self.listener.close()
