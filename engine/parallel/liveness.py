"""Liveness links: one TCP connection from every rank > 0 to rank 0's process, held open for
as long as the rank's process lives, so that rank 0 learns of a rank's end (an exit, a crash,
SIGKILL: the kernel closes the socket) at once, at start-up and while serving alike, rather
than when a heartbeat times out. A cut-off link closes nothing: the heartbeats
(membership.py) still cover that.

Contract:
- rank 0: `LivenessServer(host)` listens on a free port of `host`, the address the other
  machines reach this one at (`port`, published through the rendezvous store); a daemon thread
  accepts the ranks' connections (each opens with its rank as an ASCII line; one that does not
  is dropped and never counts) and notes which of them closed. `closed()` lists those
  ranks in the order they closed; `close()` stops listening.
- rank > 0: `hold(host, port, rank, timeout)` connects and announces the rank, and returns
  the socket, which the caller keeps referenced (dropping it would close it: the rank would
  read as gone).
"""

from __future__ import annotations

import selectors
import socket
import threading


class LivenessServer:
    def __init__(self, host: str) -> None:
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed: list[int] = []
        self._lock = threading.Lock()
        self._running = True
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        threading.Thread(target=self._serve, name="tgserve-liveness", daemon=True).start()

    def closed(self) -> list[int]:
        with self._lock:
            return list(self._closed)

    def close(self) -> None:
        self._running = False  # the thread closes the sockets within its select's timeout

    def _serve(self) -> None:
        ranks: dict[socket.socket, int | None] = {}  # a connection -> its rank once read
        while self._running:
            for key, _ in self._selector.select(timeout=0.2):
                if key.fileobj is self._listener:
                    conn, _ = self._listener.accept()
                    ranks[conn] = None
                    self._selector.register(conn, selectors.EVENT_READ, None)
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(64)
                except OSError:  # a reset: the peer is gone as surely as after a FIN
                    data = b""
                if data and ranks[conn] is None and (rank := _rank(data)) is not None:
                    ranks[conn] = rank
                elif not data or ranks[conn] is None:  # closed, or not a rank's opening line
                    self._selector.unregister(conn)
                    conn.close()
                    if (rank := ranks.pop(conn)) is not None:
                        with self._lock:
                            self._closed.append(rank)
        for conn in [self._listener, *ranks]:
            conn.close()
        self._selector.close()


def _rank(opening: bytes) -> int | None:
    line, newline, _ = opening.partition(b"\n")
    return int(line) if newline and line.isdigit() and len(line) < 10 else None


def hold(host: str, port: int, rank: int, timeout: float) -> socket.socket:
    link = socket.create_connection((host, port), timeout=timeout)
    link.settimeout(None)
    link.sendall(f"{rank}\n".encode())
    return link
