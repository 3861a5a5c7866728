"""Small network helpers shared by the launchers, the doctor and the tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
TRIES = 64  # random picks below the ephemeral range before the kernel's own pick


def ephemeral_low(path: Path = PORT_RANGE) -> int:
    """The first port the kernel hands out to outgoing connections (Linux: 32768)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now, below the ephemeral range.

    A port the kernel picks for a bind to port 0 lies in the range it also hands to every
    outgoing connection, so any client socket (a gloo peer, another job's store client) may
    take it between this pick and the server's bind: TCPStore then fails with EADDRINUSE.
    Ports below the range are only ever taken by an explicit bind."""
    low = ephemeral_low()
    pick = random.Random()  # unseeded: two processes must not walk the same sequence
    for _ in range(TRIES):
        port = pick.randrange(max(1024, low - 8192), low)
        if binds(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
