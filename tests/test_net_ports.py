"""dsenv.net.free_port: MASTER_PORT picks below the kernel's ephemeral range, so no outgoing
connection can take the port between the pick and the store's bind (the EADDRINUSE race a
kernel-picked port had under two concurrent runs)."""

from __future__ import annotations

import socket

from dsenv import net


def test_the_port_is_free_and_below_the_ephemeral_range():
    low = net.ephemeral_low()
    for _ in range(20):
        port = net.free_port()
        assert 1024 <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: binds


def test_the_range_is_read_from_the_kernels_file(tmp_path, monkeypatch):
    file = tmp_path / "ip_local_port_range"
    file.write_text("40000\t60999\n")
    assert net.ephemeral_low(file) == 40000
    monkeypatch.setattr(net, "PORT_RANGE", file)
    monkeypatch.setattr(net, "ephemeral_low", lambda path=file: int(file.read_text().split()[0]))
    assert all(40000 - 8192 <= net.free_port() < 40000 for _ in range(10))


def test_no_range_file_or_garbage_falls_back_to_linuxs_default(tmp_path):
    assert net.ephemeral_low(tmp_path / "missing") == 32768
    (tmp_path / "bad").write_text("ports\n")
    assert net.ephemeral_low(tmp_path / "bad") == 32768


def test_a_port_in_use_is_never_picked_and_none_free_falls_back_to_the_kernels(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert not net.binds("127.0.0.1", busy)
    monkeypatch.setattr(net, "binds", lambda host, port: False)
    port = net.free_port()  # every pick below the range refused: the kernel's own pick
    assert port >= net.ephemeral_low()
