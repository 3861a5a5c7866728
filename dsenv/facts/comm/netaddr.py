"""The rendezvous address and port on this host: name resolution with a time limit, which
addresses are this host's, whether a TCP port can be bound, and who holds it when not.

Listening sockets come from /proc/net/tcp and tcp6 (state 0A), their owners from the
``socket:[inode]`` links in /proc/<pid>/fd, all through ``node.path``. Binding never listens:
the socket is closed at once, so nothing is exposed.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import time
from dataclasses import dataclass

from dsenv.facts.host import processes
from dsenv.facts.node import Node

DEFAULT_MASTER_PORT = 29500  # torchrun's and DeepSpeed's runner's default --master_port
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                            "ip6-loopback"})
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
OWNER_SCAN_SECONDS = 2.0  # how long the /proc/*/fd walk may take on a busy node


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 and ::ffff:127.x are loopback; names are not addresses (False)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped and mapped.is_loopback))


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Resolution:
    name: str
    addresses: tuple[str, ...] = ()
    error: str | None = None
    seconds: float = 0.0


def resolve(name: str, timeout: float) -> Resolution:
    """socket.getaddrinfo(name) on a daemon thread, given up after ``timeout`` seconds (a
    dead DNS server must not hold the doctor; the thread ends on its own later)."""
    answer: dict[str, object] = {}

    def lookup():
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            answer["addresses"] = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
        except (OSError, UnicodeError) as exc:
            answer["error"] = str(exc) or type(exc).__name__

    start = time.monotonic()
    worker = threading.Thread(target=lookup, daemon=True, name=f"resolve {name}")
    worker.start()
    worker.join(timeout)
    seconds = time.monotonic() - start
    if worker.is_alive():
        return Resolution(name, (), f"no answer within {timeout:.0f} s", seconds)
    if "error" in answer:
        return Resolution(name, (), str(answer["error"]), seconds)
    return Resolution(name, answer.get("addresses", ()), None, seconds)  # type: ignore[arg-type]


def resolve_once(node: Node, name: str, timeout: float) -> Resolution:
    """:func:`resolve`, asked once per doctor run for each name (several checks want it)."""
    return node.memo(f"{__name__}.resolve:{name}", lambda: resolve(name, timeout))


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def is_local_address(address: str) -> bool:
    """Whether ``address`` belongs to this host: the kernel lets us bind only those."""
    if is_loopback(address):
        return True
    try:
        with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def bind_error(address: str, port: int) -> OSError | None:
    """Try to bind ``address:port`` as c10d's TCPStore server does (SO_REUSEADDR: a port in
    TIME_WAIT is free, one with a listener is not); None when it could be bound."""
    try:
        with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
    except OSError as exc:
        return exc
    return None


def in_use(exc: OSError | None) -> bool:
    return exc is not None and exc.errno == errno.EADDRINUSE


# -- who holds a port ----------------------------------------------------------------------


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    inode: int
    uid: int


def _hex_address(text: str) -> str:
    """/proc/net/tcp's little-endian hex: '0100007F' -> 127.0.0.1; 32 hex digits -> IPv6."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def parse_proc_net_tcp(text: str) -> list[Listener]:
    """The listening sockets of one /proc/net/tcp or tcp6 table."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        address, _, port = fields[1].rpartition(":")
        try:
            found.append(Listener(_hex_address(address), int(port, 16), int(fields[9]),
                                  int(fields[7])))
        except ValueError:
            continue
    return found


def listeners(node: Node, port: int) -> list[Listener]:
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = node.path(table).read_text(errors="replace")
        except OSError:
            continue
        found += [entry for entry in parse_proc_net_tcp(text) if entry.port == port]
    return found


@dataclass(frozen=True)
class Owner:
    pid: int
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def socket_owners(node: Node, inodes: set[int]) -> list[Owner]:
    """Processes holding any of these socket inodes, found through /proc/<pid>/fd; other
    users' processes stay invisible without root. Bounded by OWNER_SCAN_SECONDS."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if not wanted:
        return []
    return [Owner(p.pid, p.command)
            for p in processes.open_files(node, seconds=OWNER_SCAN_SECONDS, include_self=True)
            if wanted.intersection(p.open)]
