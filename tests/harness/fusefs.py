"""A tiny in-memory FUSE file system spoken straight to /dev/fuse: a real mount whose locks fail.

Lustre mounted without ``-o flock`` answers flock() and fcntl locks with ENOSYS (Errno 38);
NFS without a reachable lock manager answers ENOLCK (Errno 37). This machine has neither,
but its kernel has FUSE, and a FUSE server that asks the kernel to forward locks
(FUSE_POSIX_LOCKS | FUSE_FLOCK_LOCKS in its INIT reply) and answers SETLK with an error makes
the kernel return that error to flock()/lockf() unchanged (fs/fuse/file.c fuse_setlk). So a
cache folder on this mount fails the way those file systems fail, for real.

Usage (root, inside ``unshare -m``): ``python tests/harness/fusefs.py MOUNTPOINT LOCKS`` with LOCKS
``enosys``, ``enolck`` or ``local`` (the kernel's own local locks: a healthy twin), or
``statfs-hangs``: local locks, and statfs is never answered (a file server that stopped
answering: statvfs on the mount blocks until the caller dies), or ``locks-hang``: locks are
forwarded and never answered (a lock manager that stopped answering: flock() blocks even with
LOCK_NB, since the kernel waits for the server's reply), or ``all-hang``: nothing but the
mount's INIT is ever answered (a server that went away with the mount still in place: even a
stat of the mount point blocks), or ``files-hang``: everything is answered until a file named
``.ost-down`` is created in the mount's root; from then on no request about a regular file
that existed at that moment is answered (its lookup, stat, open, read, locks), while folders,
their listings and files created later answer (a Lustre whose one storage target (OST) went
down: the metadata server still answers lookups and listings, but a file's size and data are
asked of the targets that hold its objects, and new files are placed on the others). It mounts
(type ``fuse.dsenvtest``), prints ``ready`` and serves until unmounted. Files live in
memory; only what a lock probe, a write test and a directory walk need is implemented.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import sys
import time

IN_HEADER = struct.Struct("<IIQQIIIHH")  # fuse_in_header (40 bytes)
OUT_HEADER = struct.Struct("<IiQ")  # fuse_out_header (16 bytes)
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr (88 bytes)
ENTRY = struct.Struct("<QQQQII")  # fuse_entry_out, the fuse_attr follows
OPEN_OUT = struct.Struct("<QIi")  # fuse_open_out
INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")  # fuse_init_out (64 bytes)
KSTATFS = struct.Struct("<QQQQQIIII24x")  # fuse_kstatfs (80 bytes)
DIRENT = struct.Struct("<QQII")  # fuse_dirent: ino, next offset, name length, type; the name
OST_DOWN = b".ost-down"  # files-hang: creating it takes down the files that exist then

LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
MKDIR, UNLINK, RMDIR, RENAME = 9, 10, 11, 12
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC = 14, 15, 16, 17, 18, 20
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 25, 26, 27, 28, 29, 30
GETLK, SETLK, SETLKW, ACCESS, CREATE, INTERRUPT, DESTROY = 31, 32, 33, 34, 35, 36, 38
BATCH_FORGET = 42
POSIX_LOCKS, FLOCK_LOCKS = 1 << 1, 1 << 10
ROOT = 1
LOCK_ERRORS = {"enosys": errno.ENOSYS, "enolck": errno.ENOLCK, "local": 0, "statfs-hangs": 0,
               "locks-hang": 0, "all-hang": 0, "files-hang": 0}
NEVER_ANSWERED = {"statfs-hangs": frozenset({STATFS}), "locks-hang": frozenset({SETLK, SETLKW}),
                  "all-hang": frozenset(range(1, 64)) - {INIT, DESTROY}}


class Node:
    def __init__(self, ino: int, mode: int):
        self.ino, self.mode, self.data = ino, mode, bytearray()
        self.children: dict[bytes, int] = {}
        self.mtime = time.time()


class Server:
    def __init__(self, fd: int, lock_error: int, never: frozenset = frozenset(),
                 files_can_go_down: bool = False):
        self.fd, self.lock_error, self.never = fd, lock_error, never
        self.nodes = {ROOT: Node(ROOT, stat.S_IFDIR | 0o777)}
        self.next_ino = ROOT + 1
        self.files_can_go_down = files_can_go_down
        self.down: set[int] = set()  # files-hang: regular files whose requests go unanswered

    # -- replies ---------------------------------------------------------------------
    def reply(self, unique: int, payload: bytes = b"", error: int = 0) -> None:
        body = b"" if error else payload
        os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)

    def attr(self, node: Node) -> bytes:
        sec, nsec = int(node.mtime), int((node.mtime % 1) * 1e9)
        nlink = 2 if stat.S_ISDIR(node.mode) else 1
        size = len(node.data)
        return ATTR.pack(node.ino, size, (size + 511) // 512, sec, sec, sec, nsec, nsec, nsec,
                         node.mode, nlink, os.getuid(), os.getgid(), 0, 4096, 0)

    def entry(self, node: Node) -> bytes:
        return ENTRY.pack(node.ino, 0, 0, 0, 0, 0) + self.attr(node)  # nothing cached

    def new_node(self, parent: int, name: bytes, mode: int) -> Node:
        node = self.nodes[self.next_ino] = Node(self.next_ino, mode)
        self.next_ino += 1
        self.nodes[parent].children[name] = node.ino
        if self.files_can_go_down and parent == ROOT and name == OST_DOWN:
            self.down = {n.ino for n in self.nodes.values()
                         if stat.S_ISREG(n.mode) and n.ino != node.ino}
        return node

    def listing(self, node: Node, offset: int, size: int) -> bytes:
        """READDIR: the folder's entries from ``offset`` on, as many as fit in ``size``."""
        out = b""
        names = list(node.children.items())
        for index, (name, ino) in enumerate(names[offset:], start=offset + 1):
            kind = (self.nodes[ino].mode & 0o170000) >> 12
            entry = DIRENT.pack(ino, index, len(name), kind) + name
            entry += b"\0" * (-len(entry) % 8)
            if len(out) + len(entry) > size:
                break
            out += entry
        return out

    def unanswered(self, opcode: int, nodeid: int, name: bytes) -> bool:
        """files-hang: a request about a file that went down (a lookup of one by name too)."""
        if nodeid in self.down:
            return opcode not in (RELEASE, FLUSH)
        node = self.nodes.get(nodeid)
        return (opcode == LOOKUP and node is not None
                and node.children.get(name) in self.down)

    # -- requests ---------------------------------------------------------------------
    def handle(self, opcode: int, unique: int, nodeid: int, body: bytes) -> bool:
        """Answer one request; False when the file system is going away."""
        node = self.nodes.get(nodeid)
        name = body.split(b"\0", 1)[0]
        if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
            return True  # no reply expected
        if opcode in self.never or (self.down and self.unanswered(opcode, nodeid, name)):
            return True  # never answered: the caller waits as on a hung file server
        if opcode == INIT:
            major, minor, readahead, flags = struct.unpack_from("<IIII", body)
            forward = self.lock_error or SETLK in self.never
            wanted = POSIX_LOCKS | FLOCK_LOCKS if forward else 0
            self.reply(unique, INIT_OUT.pack(7, min(minor, 31), readahead, flags & wanted,
                                             16, 12, 65536, 1, 0, 0, 0))
        elif opcode == DESTROY:
            self.reply(unique)
            return False
        elif node is None:
            self.reply(unique, error=errno.ENOENT)
        elif opcode == LOOKUP:
            child = node.children.get(name)
            if child is None:
                self.reply(unique, error=errno.ENOENT)
            else:
                self.reply(unique, self.entry(self.nodes[child]))
        elif opcode in (GETATTR, SETATTR):
            if opcode == SETATTR:
                valid, _pad, _fh, size = struct.unpack_from("<IIQQ", body)
                if valid & (1 << 3):  # FATTR_SIZE
                    del node.data[size:]
                if valid & 1:  # FATTR_MODE (chmod): fuse_setattr_in's mode at offset 68
                    mode, = struct.unpack_from("<I", body, 68)
                    node.mode = (node.mode & 0o170000) | (mode & 0o7777)
            self.reply(unique, struct.pack("<QII", 0, 0, 0) + self.attr(node))
        elif opcode == MKDIR:
            mode, _umask = struct.unpack_from("<II", body)
            name = body[8:].split(b"\0", 1)[0]
            self.reply(unique, self.entry(self.new_node(nodeid, name, stat.S_IFDIR | mode)))
        elif opcode == CREATE:
            _flags, mode = struct.unpack_from("<II", body)
            name = body[16:].split(b"\0", 1)[0]
            child = self.new_node(nodeid, name, stat.S_IFREG | (mode & 0o7777))
            self.reply(unique, self.entry(child) + OPEN_OUT.pack(child.ino, 0, 0))
        elif opcode in (UNLINK, RMDIR):
            child = node.children.pop(name, None)
            self.reply(unique, error=0 if child else errno.ENOENT)
        elif opcode == RENAME:
            newdir, = struct.unpack_from("<Q", body)
            old, new = body[8:].split(b"\0")[:2]
            child = node.children.pop(old, None)
            if child is None:
                self.reply(unique, error=errno.ENOENT)
            else:
                self.nodes[newdir].children[new] = child
                self.reply(unique)
        elif opcode in (OPEN, OPENDIR):
            self.reply(unique, OPEN_OUT.pack(nodeid, 0, 0))
        elif opcode == READ:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            self.reply(unique, bytes(node.data[offset:offset + size]))
        elif opcode == WRITE:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            data = body[40:40 + size]
            node.data[offset:offset + len(data)] = data
            self.reply(unique, struct.pack("<II", len(data), 0))
        elif opcode == READDIR:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            self.reply(unique, self.listing(node, offset, size))
        elif opcode == STATFS:
            self.reply(unique, KSTATFS.pack(1 << 20, 1 << 19, 1 << 19, 1 << 16, 1 << 15, 4096,
                                            255, 4096, 0))
        elif opcode in (SETLK, SETLKW):
            self.reply(unique, error=self.lock_error)
        elif opcode == GETLK:
            if self.lock_error:
                self.reply(unique, error=self.lock_error)
            else:  # F_UNLCK: nobody holds it
                self.reply(unique, struct.pack("<QQII", 0, 0, 2, 0))
        elif opcode in (RELEASE, RELEASEDIR, FLUSH, FSYNC, FSYNCDIR, ACCESS):
            self.reply(unique)
        else:
            self.reply(unique, error=errno.ENOSYS)
        return True

    def serve(self) -> None:
        while True:
            try:
                request = os.read(self.fd, 1 << 17)
            except OSError as exc:
                if exc.errno == errno.EINTR or exc.errno == errno.ENOENT:
                    continue  # ENOENT: an interrupted request vanished
                return  # ENODEV: unmounted
            _len, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(request)
            try:
                alive = self.handle(opcode, unique, nodeid, request[IN_HEADER.size:])
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # the kernel dropped an interrupted request
                    raise
                alive = True
            if not alive:
                return


def mount(target: str, lock_error: int) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    data = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
    if libc.mount(b"dsenvtest", target.encode(), b"fuse.dsenvtest", 0, data.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount fuse on {target}: {os.strerror(code)}")
    return fd


def main(argv: list[str]) -> int:
    target, mode = argv
    fd = mount(target, LOCK_ERRORS[mode])
    print("ready", flush=True)
    Server(fd, LOCK_ERRORS[mode], NEVER_ANSWERED.get(mode, frozenset()),
           files_can_go_down=mode == "files-hang").serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
