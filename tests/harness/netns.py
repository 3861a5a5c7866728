"""Namespaced hosts for multi-node tests: N Linux network namespaces joined by bridges.

Each host is a network namespace (``ip netns``) plus a UTS and a mount namespace held by one
``sleep`` process, so it has its own hostname (``h1`` ...), its own /etc/hosts (``ip netns
exec`` binds /etc/netns/NAME/hosts over /etc/hosts) and mounts of its own (a small /dev/shm,
an emptied cache folder, another package version) that every process started in it shares:
the slurmd, the sshd, the job steps they start and the commands a test runs with
:meth:`Host.command`.

The network is a fabric-like interface ``hsn0`` on 192.0.2.0/24 and a management interface
``nmn0`` on 198.51.100.0/24 (RFC 5737 TEST-NET ranges, never routed), veth pairs whose other
ends join one bridge per network inside a namespace of their own. No interface of the
machine's own namespace joins them and no namespace gets a default route, so traffic stays
inside the namespaces made here. Teardown deletes the namespaces (which deletes their
interfaces) and kills the holders; namespaces left by a killed test run are deleted by the
next :func:`make_hosts` (their names carry the pid of the run that made them).

The kernel here has no netem qdisc; a slow link is staged with ``tc ... tbf rate``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "dsvt"
FABRIC = ("hsn0", "192.0.2.")
MANAGEMENT = ("nmn0", "198.51.100.")
FIRST_HOST_OCTET = 11
MAX_HOSTS = 4


class NetnsUnavailable(Exception):
    """This machine cannot make network namespaces (not root, no ip, no veth)."""


def _ip(*args: str, timeout: float = 15) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete namespaces of earlier runs whose process is gone (an interrupted test)."""
    removed = []
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=15)
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not _pid_alive(int(owner)):
            _delete_netns(name)
            removed.append(name)
    return removed


def _delete_netns(name: str) -> None:
    """End the processes still inside (a holder, a daemon, a rank a test left: they would
    keep the namespace's interfaces alive), then delete it and its /etc/netns folder."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                          timeout=15).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=15)
    shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


@dataclass
class Host:
    name: str
    netns: str
    fabric_ip: str
    management_ip: str
    holder: subprocess.Popen | None = None
    mounts: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.holder is not None
        return self.holder.pid

    def command(self, argv, cwd=None) -> list[str]:
        """argv as run on this host (its network, hostname and mounts)."""
        wd = str(cwd or os.getcwd())
        return ["nsenter", f"--target={self.pid}", "--net", "--uts", "--mount", f"--wd={wd}",
                "--", *[str(a) for a in argv]]

    def run(self, argv, *, timeout: float, env=None, cwd=None, check=False,
            input=None) -> subprocess.CompletedProcess:
        done = subprocess.run(self.command(argv, cwd), capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd, input=input)
        if check and done.returncode != 0:
            raise RuntimeError(f"on {self.name}: {' '.join(map(str, argv))} -> rc "
                               f"{done.returncode}: {done.stderr.strip()[-400:]}")
        return done

    def popen(self, argv, *, log: Path, env=None, cwd=None) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(self.command(argv, cwd), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env, cwd=cwd)

    # -- making a host differ ----------------------------------------------------------------
    def mount_tmpfs(self, target: str | Path, size_mb: int) -> None:
        self.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(target)],
                 timeout=15, check=True)
        self.mounts.append(str(target))

    def bind(self, source: str | Path, target: str | Path) -> None:
        self.run(["mount", "--bind", str(source), str(target)], timeout=15, check=True)
        self.mounts.append(str(target))

    def undo_mounts(self) -> None:
        while self.mounts:
            self.run(["umount", "-l", self.mounts.pop()], timeout=15)

    def link(self, interface: str, state: str) -> None:
        _ip("-n", self.netns, "link", "set", interface, state)

    def drop_tcp_port(self, port: int) -> None:
        """An nftables drop of incoming TCP to PORT inside this host only."""
        script = ("table inet dsenvtest {\n chain input {\n  type filter hook input "
                  f"priority 0;\n  tcp dport {port} drop\n }}\n}}\n")
        self.run(["nft", "-f", "-"], timeout=15, check=True, input=script)

    def allow_all(self) -> None:
        self.run(["nft", "delete", "table", "inet", "dsenvtest"], timeout=15)

    def limit_rate(self, interface: str, rate: str) -> None:
        """Outgoing rate limit on one interface (token bucket; this kernel has no netem)."""
        self.run(["tc", "qdisc", "replace", "dev", interface, "root", "tbf", "rate", rate,
                  "burst", "32kbit", "latency", "400ms"], timeout=15, check=True)

    def unlimit(self, interface: str) -> None:
        self.run(["tc", "qdisc", "del", "dev", interface, "root"], timeout=15)


class Hosts:
    """N namespaced hosts h1..hN on a fabric and a management network."""

    def __init__(self, count: int = 2, state_dir: Path | None = None):
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"1 to {MAX_HOSTS} hosts, not {count}")
        self.tag = f"{PREFIX}{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.bridge_ns = f"{self.tag}-br"
        self.state_dir = state_dir or Path("/tmp") / self.tag
        self.hosts = [Host(f"h{i}", f"{self.tag}-h{i}", f"{FABRIC[1]}{FIRST_HOST_OCTET + i - 1}",
                           f"{MANAGEMENT[1]}{FIRST_HOST_OCTET + i - 1}")
                      for i in range(1, count + 1)]
        self._namespaces: list[str] = []

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    @property
    def first(self) -> Host:
        return self.hosts[0]

    def hosts_file(self) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        for host in self.hosts:
            lines.append(f"{host.fabric_ip} {host.name}")
            lines.append(f"{host.management_ip} {host.name}-nmn")
        return "\n".join(lines) + "\n"

    def start(self) -> Hosts:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
            raise NetnsUnavailable("namespaced hosts need root, ip and nsenter")
        remove_stale()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._add_netns(self.bridge_ns)
            for network, _ in (FABRIC, MANAGEMENT):
                _ip("-n", self.bridge_ns, "link", "add", f"br-{network}", "type", "bridge")
                _ip("-n", self.bridge_ns, "link", "set", f"br-{network}", "up")
            for host in self.hosts:
                self._start_host(host)
        except BaseException:
            self.stop()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)

    def _start_host(self, host: Host) -> None:
        self._add_netns(host.netns)
        etc = Path("/etc/netns") / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(self.hosts_file())
        for (network, _), address in ((FABRIC, host.fabric_ip),
                                           (MANAGEMENT, host.management_ip)):
            peer = f"{host.name}-{network}"
            _ip("-n", self.bridge_ns, "link", "add", peer, "type", "veth", "peer", "name",
                network, "netns", host.netns)
            _ip("-n", self.bridge_ns, "link", "set", peer, "master", f"br-{network}", "up")
            _ip("-n", host.netns, "addr", "add", f"{address}/24", "dev", network)
            _ip("-n", host.netns, "link", "set", network, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        # The holder: `ip netns exec` gives the per-netns /etc/hosts and a /sys that shows
        # this namespace's interfaces; unshare adds a hostname and mounts of the host's own.
        # slurmd needs the cgroup folders that the fresh /sys lacks: mount the machine's
        # hierarchies again there.
        script = f"hostname {host.name} && {cgroup_mounts()} exec sleep infinity"
        host.holder = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount",
             "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if host.holder.poll() is not None:
                raise NetnsUnavailable(f"the holder of {host.name} exited "
                                       f"(rc {host.holder.returncode})")
            # The holder is ready once sleep runs under the new hostname.
            probe = subprocess.run(["nsenter", f"--target={host.holder.pid}", "--uts",
                                    "hostname"], capture_output=True, text=True, timeout=5)
            if probe.stdout.strip() == host.name and _comm(host.holder.pid) == "sleep":
                return
            time.sleep(0.05)
        raise NetnsUnavailable(f"host {host.name} did not come up within 15 s")

    def stop(self) -> None:
        for host in self.hosts:
            if host.holder is not None and host.holder.poll() is None:
                os.killpg(host.holder.pid, signal.SIGKILL)
                host.holder.wait(timeout=15)
        for name in reversed(self._namespaces):
            _delete_netns(name)
        self._namespaces.clear()


def cgroup_mounts() -> str:
    """Shell commands that mount this machine's cgroup hierarchies under a fresh /sys."""
    commands = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, kind, options = line.split()[:4]
        if not target.startswith("/sys/fs/cgroup"):
            continue
        if kind == "tmpfs" and target == "/sys/fs/cgroup":
            commands.append("mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup")
        elif kind in ("cgroup", "cgroup2"):
            wanted = ",".join(o for o in options.split(",") if o not in ("rw", "relatime"))
            commands.append(f"mkdir -p {target} && mount -t {kind} "
                            + (f"-o {wanted} " if wanted else "") + f"{kind} {target}")
    return "".join(f"{c} && " for c in commands)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def machine_interfaces() -> set[str]:
    """The interface names of the machine's own namespace (teardown tests compare them)."""
    return set(os.listdir("/sys/class/net"))


# ----------------------------------------------------------------------------- ssh
SSHD_CONFIG = """\
Port 22
ListenAddress {fabric_ip}
ListenAddress {management_ip}
HostKey {folder}/host_{name}
PidFile {folder}/sshd-{name}.pid
AuthorizedKeysFile {folder}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
"""

# Bound over /etc/ssh/ssh_config inside each host: the fixture's root key and known hosts,
# without touching the machine's own ~/.ssh.
SSH_CONFIG = """\
Host *
    IdentityFile {folder}/id_ed25519
    UserKnownHostsFile {folder}/known_hosts
    StrictHostKeyChecking yes
    ConnectTimeout 5
    LogLevel ERROR
"""


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, capture_output=True, timeout=30)
    return path.with_suffix(".pub").read_text().strip()


def start_ssh(hosts: Hosts) -> dict[str, subprocess.Popen]:
    """One sshd per host and a root key every host accepts (`ssh -o BatchMode=yes` works)."""
    if not shutil.which("sshd") and not Path("/usr/sbin/sshd").exists():
        raise NetnsUnavailable("openssh-server is not installed")
    folder = hosts.state_dir / "ssh"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    (folder / "authorized_keys").write_text(_keygen(folder / "id_ed25519") + "\n")
    known = []
    for host in hosts.hosts:
        key = _keygen(folder / f"host_{host.name}").split()[:2]
        names = ",".join([host.name, f"{host.name}-nmn", host.fabric_ip, host.management_ip])
        known.append(f"{names} {' '.join(key)}")
    (folder / "known_hosts").write_text("\n".join(known) + "\n")
    (folder / "ssh_config").write_text(SSH_CONFIG.format(folder=folder))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    daemons = {}
    for host in hosts.hosts:
        config = folder / f"sshd_config-{host.name}"
        config.write_text(SSHD_CONFIG.format(folder=folder, name=host.name,
                                             fabric_ip=host.fabric_ip,
                                             management_ip=host.management_ip))
        host.run(["mount", "--bind", folder / "ssh_config", "/etc/ssh/ssh_config"], timeout=15,
                 check=True)
        daemons[host.name] = host.popen(["/usr/sbin/sshd", "-D", "-e", "-f", config],
                                        log=folder / f"sshd-{host.name}.log")
    deadline = time.monotonic() + 20
    for host in hosts.hosts:
        while True:
            if daemons[host.name].poll() is not None:
                raise NetnsUnavailable(f"sshd on {host.name} exited: "
                                       + (folder / f"sshd-{host.name}.log").read_text()[-300:])
            if (folder / f"sshd-{host.name}.pid").exists():
                break
            if time.monotonic() > deadline:
                raise NetnsUnavailable(f"sshd on {host.name} did not start within 20 s")
            time.sleep(0.05)
    return daemons
