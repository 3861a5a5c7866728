"""Who left: every rank of ``dsenv doctor --distributed`` keeps one TCP connection to rank 0.

The kernel closes it the moment a process ends, however it ends, so rank 0 knows at once
which rank exited (and the ranks know when rank 0 did). Lines on a connection: ``rank N``
(a peer says who it is), ``done`` (either side finished), ``abort "<why>"`` (rank 0 stops
the run).
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsenv.doctor.distributed.rank import RankRun


class LivenessServer(threading.Thread):
    """Rank 0's end: one connection per rank; a close without 'done' is a rank that left."""

    def __init__(self, run: RankRun):
        super().__init__(daemon=True, name="liveness")
        self.run_ = run
        if socket.has_dualstack_ipv6():
            self.sock = socket.create_server(("", 0), family=socket.AF_INET6,
                                             dualstack_ipv6=True)
        else:
            self.sock = socket.create_server(("", 0))
        self.port = self.sock.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.peers: dict[socket.socket, dict] = {}
        self.gone_done = 0  # ranks that said done and closed their connection
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=0.5):
                if key.fileobj is self.sock:
                    conn, _ = self.sock.accept()
                    conn.setblocking(False)
                    with self.lock:
                        self.peers[conn] = {"rank": None, "buffer": b"", "done": False}
                    self.selector.register(conn, selectors.EVENT_READ)
                    continue
                self._read(key.fileobj)

    def _read(self, conn: socket.socket) -> None:
        peer = self.peers[conn]
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(conn)
            with self.lock:
                self.peers.pop(conn, None)
                self.gone_done += peer["done"]
            conn.close()
            if peer["rank"] is not None and not peer["done"]:
                self.run_.peer_exited(peer["rank"])
            return
        peer["buffer"] += data
        while b"\n" in peer["buffer"]:
            line, peer["buffer"] = peer["buffer"].split(b"\n", 1)
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "rank" and rest.strip().isdigit():
                peer["rank"] = int(rest)
            elif word == "done":
                peer["done"] = True

    def wait_done(self, peers: int) -> None:
        """Until ``peers`` ranks said done (the watchdog ends a wait that never ends)."""
        while True:
            with self.lock:
                done = sum(p["done"] for p in self.peers.values()) + self.gone_done
            if done >= peers:
                return
            time.sleep(0.005)

    def broadcast(self, line: str) -> None:
        with self.lock:
            peers = list(self.peers)
        for conn in peers:
            try:
                conn.send((line + "\n").encode())
            except OSError:
                pass


class LivenessClient(threading.Thread):
    """A peer's end: an 'abort' line from rank 0 stops this rank; so does rank 0's exit."""

    def __init__(self, run: RankRun, host: str, port: int):
        super().__init__(daemon=True, name="liveness")
        self.run_ = run
        self.sock = socket.create_connection((host, port), timeout=run.remaining())
        self.sock.settimeout(None)
        self.send(f"rank {run.rank}")

    def send(self, line: str) -> None:
        try:
            self.sock.sendall((line + "\n").encode())
        except OSError:
            pass

    def run(self) -> None:
        buffer = b""
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                if not self.run_.rank0_done:
                    self.run_.rank0_lost()
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == "done":
                    self.run_.rank0_done = True
                elif word == "abort":
                    self.run_.end("aborted", "rank 0 stopped the run: " + json.loads(rest))
