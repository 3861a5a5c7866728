"""Launchers and rendezvous, read by structure: torch.distributed's env:// and TCPStore
(the variable it wanted, the host:port a client could not reach and the errno), torchrun's
elastic rendezvous (RendezvousConnectionError / RendezvousTimeoutError, the store barrier's
world_size and worker_count), the deepspeed runner (hostfile, pdsh, MPI discovery,
`hostname -I`), ssh's own failures (resolution, refused port, host key, public key) and the
agent's death by a hangup of the session that started it.

Each rule names the part it read and the catalogue mode that part means (doctor/modes/
launch.toml), so a new torch wording, another port or another host still reads the same.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "launch"
FLAGS = re.IGNORECASE | re.MULTILINE

# The launcher's variables: env:// names the one it wanted; a script's os.environ[...] too.
_ENV_VAR = re.compile(r"environment variable (\w+) expected, but not set"
                      r"|_env_error\(\"(\w+)\"\)"
                      r"|KeyError: '(RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)'", FLAGS)
# Slurm's per-task variables (srun's tasks, sbatch's batch step): read outside a Slurm task.
_SLURM_VAR = re.compile(r"KeyError\W{0,3}'(SLURM_(?:PROCID|LOCALID|NODEID))'", FLAGS)
_MPI4PY = re.compile(r"No module named '?mpi4py'?", FLAGS)
_MPI_DISCOVERY = re.compile(r"mpi_discovery|detect MPI environment", FLAGS)
_MPI_RUN = re.compile(r"\bmpirun\b|\bmpiexec\b|-m mpi4py", FLAGS)
_HOSTNAME_I = re.compile(r"hostname: (?:invalid|illegal) option -- '?I'?"
                         r"|Command '\['(hostname -I)'\]' (?:returned non-zero exit status (\d+)"
                         r"|died with)", FLAGS)
# Windows has no `hostname -I` at all (cmd.exe's refusal, a drive-letter path to the package):
# DeepSpeed's distributed init runs there, which it does not support
_WINDOWS_SHELL = re.compile(r"is not recognized as an internal or external command|\u4e0d\u662f\u5185"
                            r"\u90e8\u6216\u5916\u90e8\u547d\u4ee4|\b[A-Z]:\\\\?(?:[\w.-]+\\\\?)+site-packages"
                            r"|\bpython\.exe\b", FLAGS)
_CMD_HOSTNAME_I = re.compile(r"'\"?hostname -I\"?' (?:is not recognized|\u4e0d\u662f\u5185\u90e8)", FLAGS)
_LOCAL_RANK = re.compile(r"unrecognized arguments:.*?(--local[-_]rank)", FLAGS)
_LIBUV = re.compile(r"use_libuv was requested but PyTorch was buil[dt] without libuv", FLAGS)
# c10d's client: "failed to connect to [host]:port (errno: 110 - Connection timed out)",
# "timed out after 60s while trying to connect to (host, port)", gai's "addresses of (host,
# port) cannot be retrieved (gai error: -2 - Name or service not known)".
_CLIENT = re.compile(r"client socket has (?:timed out after \S+ while trying to connect|failed"
                     r" to connect) to (?:any network address of )?(?:\[([^\]]+)\]:(\d+)"
                     r"|\(([^,\s]+), (\d+)\)|([\w.-]+):(\d+))(?:.*?errno: (\d+) - ([^)]*))?", FLAGS)
_GAI = re.compile(r"network addresses of \((\S+), (\d+)\) cannot be retrieved \(gai error: "
                  r"(-?\d+) - ([^)]*)\)|host not found: Name or service not known", FLAGS)
_BIND = re.compile(r"failed to bind to (\S+?) \(errno: 98|port: (\d+), useIpv6: \S+ code: -(?:98|48)"
                   r"|\bEADDRINUSE\b|Address already in use"
                   # accelerate checks the port before it starts torch's store
                   r"|launch distributed communication on port `?(\d+)`?, but another process "
                   r"is utilizing it", FLAGS)
# The bind refused with EACCES (errno 13; newer torch: "code: -13, name: EACCES"): below 1024
# only root may bind, so the port number tells a privileged port from another refusal.
_BIND_DENIED = re.compile(r"failed to bind to \S*?:(\d+) \(errno: 13\b"
                          r"|port: (\d+), useIpv6: \S+ code: -13\b"
                          r"|Permission denied\W+The server socket has failed to bind to \S*?:(\d+)",
                          FLAGS)
_RDZV_CONN = re.compile(r"RendezvousConnectionError|connection to the C10d store has failed", FLAGS)
_RDZV_TIMEOUT = re.compile(r"RendezvousTimeoutError|Timed out after \d+ seconds waiting for "
                           r"clients\. (\d+)/(\d+) clients joined", FLAGS)
_BARRIER = re.compile(r"store based barrier.*?world_size=(\d+), worker_count=(\d+)", FLAGS)
# ssh, directly or through pdsh ("pdsh@host: node: ssh exited with exit code 255").
_SSH_RESOLVE = re.compile(r"ssh: Could not resolve hostname ([^:\s]+)", FLAGS)
_SSH_CONNECT = re.compile(r"ssh: connect to host (\S+) port (\d+): ([A-Za-z ]+)", FLAGS)
# OpenSSH's own check of the libcrypto it loaded (a conda env's lib/ on LD_LIBRARY_PATH)
_SSH_OPENSSL = re.compile(r"OpenSSL version mismatch\. Built against ([0-9a-f]{8}), you have "
                          r"([0-9a-f]{8})", re.I)
_SSH_HOSTKEY = re.compile(r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED"
                          r"|No \S+ host key is known for (\S+)", FLAGS)
_SSH_PUBKEY = re.compile(r"(\S+@\S+: )?Permission denied \((publickey[\w,-]*)\)"
                         r"|Permission denied, please try again", FLAGS)
# ssh refusing its own files (owner, mode), on the client or in the server's log
_SSH_FILE_MODES = re.compile(r"Bad owner or permissions on (\S+)|Authentication refused: bad "
                             r"ownership or modes for (?:file|directory) (\S+)", FLAGS)
# sshd started by hand in a container that never prepared it: no host keys, no privsep folder
_SSHD_UNPREPARED = re.compile(r"sshd: no hostkeys available|Could not load host key: (\S+)"
                              r"|Missing privilege separation directory: ([^\s'\\]+)", FLAGS)
# sshd drops unauthenticated connections past MaxStartups before the key exchange: a launcher
# that fans out (pdsh -f 1024) loses some hosts at random
_SSHD_MAXSTARTUPS = re.compile(r"Exceeded MaxStartups|past MaxStartups|(kex|ssh)_exchange_"
                               r"identification: (?:read: Connection reset by peer|Connection "
                               r"closed by remote host)", FLAGS)
_SSH_CHECK = re.compile(r"host=(\S+) was not reachable via ssh"
                        r"|Command '\[?'?ssh (?:-o \S+ )*(\S+) hostname(?: -I)?'?\]?' returned "
                        r"non-zero exit status 255", FLAGS)
_PDSH_EXIT = re.compile(r"pdsh@\S+: (\S+): ssh exited with exit code (\d+)", FLAGS)
# DeepSpeed's runner words every backend it cannot find the same way ("launcher 'openmpi' not
# installed" is mpirun missing): only pdsh's is this mode, and the runner's own source line
# (its default launcher is pdsh)
_PDSH_MISSING = re.compile(r"launcher '(pdsh|\{args\.launcher\})' not installed|(pdsh): command "
                           r"not found", FLAGS)
_PDSH_RCMD = re.compile(r"rcmd: socket: Permission denied|(mcmd): xpoll: protocol failure", FLAGS)
_NO_HOSTFILE = re.compile(r"Unable to find hostfile", FLAGS)
_REMOTE_PATH = re.compile(r"bash: line 0: cd: (\S+): No such file or directory"
                          r"|bash: (\S+/bin/python3?): No such file or directory"
                          r"|\b(orted|prted): command not found"
                          # MPICH/Intel MPI's Hydra: its proxy not where mpiexec is on that host,
                          # or the launch folder missing there
                          r"|execvp error on file (\S*hydra_pmi_proxy) \(No such file"
                          r"|(\./hydra_pmi_proxy): No such file or directory"
                          r"|unable to change wdir to (\S+) \(No such file or directory\)", FLAGS)
_PDSH_CMD = re.compile(r"cmd = pdsh .*?-w (\S+) ((?:export \w+=[^;]*; )+)", FLAGS)
# torchrun's agent taking a hangup as its death signal and forwarding it to the ranks (older
# torch: "Received 1 death signal", newer: "Received Signals.SIGHUP death signal"), or the
# SignalException it raises; never another signal (15 is SIGTERM: a scheduler, a crash).
_SIGHUP = re.compile(r"Received (?:(1)|Signals\.(SIGHUP)) death signal"
                     r"|Sending process (\d+) closing signal (SIGHUP)"
                     r"|SignalException: Process (\d+) got (?:signal|sigval) ?: ?(1)\b", FLAGS)


# Ray refuses a process whose Ray (or Python) differs from the cluster head's: its two blocks
# ("The cluster was started with: Ray: X Python: A ... This process ... Ray: Y Python: B"),
# or Ray Client's one line for the Python minor.
_RAY_SIDE = r"\s*Ray: (?P<{0}_ray>[\w.+-]+)(?:\s*Ray location: \S+)?\s*Python: (?P<{0}_py>[\d.]+)"
_RAY = re.compile(r"Version mismatch: The cluster was started with:" + _RAY_SIDE.format("head")
                  + r"[\s\S]{0,200}?This process on node \S+ was started with:"
                  + _RAY_SIDE.format("here"), FLAGS)
_RAY_CLIENT = re.compile(r"Python minor versions differ between client and server: client is "
                         r"(?P<client>[\d.]+), server is (?P<server>[\d.]+)", FLAGS)


# torchrun's elastic rendezvous closed by an agent that exited (or an earlier job's run id)
_RDZV_CLOSED = re.compile(r"\bRendezvousClosedError\b", FLAGS)
_RDZV_BACKEND = re.compile(r"--rdzv[_-]backend[= ](\w+)|rendezvous[/\\](\w+)_rendezvous\.py", FLAGS)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def read(message: str) -> list[Reading]:
    found: list[Reading] = []

    def add(mode: str, match: re.Match, **parts: str) -> None:
        found.append(reading(FAMILY, mode, match.group(0), **parts))

    if m := _ENV_VAR.search(message):  # only a launcher sets these: none ran
        add("launch.env-vars-no-launcher", m,
            variable=next(g for g in m.groups() if g))
    if m := _SLURM_VAR.search(message):  # only a Slurm task has these: not started by srun
        add("launch.slurm-vars-outside-step", m, variable=m.group(1))
    discovery = _MPI_DISCOVERY.search(message)
    if (m := _MPI4PY.search(message)) and (discovery or not _MPI_RUN.search(message)):
        # DeepSpeed's fallback when no launcher set them; under mpirun mpi4py is wanted
        add("launch.ds-mpi-discovery-fallback", m, module="mpi4py",
            fallback="mpi_discovery" if discovery else "")
    if (m := _HOSTNAME_I.search(message) or _CMD_HOSTNAME_I.search(message)) and (
            win := _WINDOWS_SHELL.search(message)):
        add("launch.deepspeed-on-windows", m, command="hostname -I", platform="Windows",
            seen=win.group(0))
    elif m:  # the hostname here has no -I
        add("launch.hostname-i-unsupported", m, command="hostname -I",
            exit_status=m.group(2) or "")
    if m := _LOCAL_RANK.search(message):  # launch.py passes it, the script does not take it
        add("launch.local-rank-arg", m, argument=m.group(1))
    if m := _LIBUV.search(message):
        add("launch.tcpstore-no-libuv", m, backend="libuv")
    if m := _SIGHUP.search(message):  # the session that started the launcher hung up
        add("launch.sighup-session-closed", m, signal="SIGHUP (1)",
            forwarded_to=m.group(3) or "", agent_pid=m.group(5) or "")
    if m := _RDZV_CLOSED.search(message):  # another agent closed it: a symptom here
        backend = _RDZV_BACKEND.search(message)
        add("launch.rdzv-closed", m, backend=(backend.group(1) or backend.group(2))
            if backend else "")
    if m := _RAY.search(message):  # which of the two differs says what to align
        differs = [name for name, a, b in (("Ray", m["head_ray"], m["here_ray"]), (
            "Python", _minor(m["head_py"]), _minor(m["here_py"]))) if a != b]
        add("launch.ray-version-mismatch", m, cluster=f"Ray {m['head_ray']}, Python "
            f"{m['head_py']}", this_process=f"Ray {m['here_ray']}, Python {m['here_py']}",
            differs=" and ".join(differs))
    elif m := _RAY_CLIENT.search(message):
        add("launch.ray-version-mismatch", m, cluster=f"Python {m['server']}",
            this_process=f"Python {m['client']}", differs="Python")
    _read_rendezvous(message, add)
    _read_ssh(message, add)
    _read_runner(message, add)
    return found


def _read_rendezvous(message: str, add) -> None:
    if m := _BARRIER.search(message):
        # fewer workers than world_size: a node never came; more: another run shares it
        size, count = int(m.group(1)), int(m.group(2))
        mode = "launch.store-shared" if count > size else "launch.rdzv-timeout"
        add(mode, m, world_size=str(size), worker_count=str(count))
    elif m := _RDZV_TIMEOUT.search(message):
        add("launch.rdzv-timeout", m, joined=m.group(1) or "", expected=m.group(2) or "")
    if m := _RDZV_CONN.search(message):  # torchrun's agent never reached its C10d store
        client = _CLIENT.search(message)
        add("launch.rdzv-wrong-interface", m, endpoint=_endpoint(client))
        return
    if m := _BIND_DENIED.search(message):  # the server side: the port is not this user's
        port = m.group(1) or m.group(2) or m.group(3)
        if int(port) < 1024:  # a privileged port; a high one refused is another story
            add("launch.privileged-port", m, port=port, errno="13 EACCES")
        return
    if m := _BIND.search(message):  # the server side: the port is someone else's
        port = m.group(2) or m.group(3) or (m.group(1) or "").rpartition(":")[2]
        add("launch.port-in-use", m, port=port, errno="98 EADDRINUSE")
        return
    if m := _GAI.search(message):  # the rendezvous name does not resolve here
        add("launch.master-addr-other-hosts", m, host=m.group(1) or "", port=m.group(2) or "",
            error=m.group(4) or "Name or service not known")
        return
    if m := _CLIENT.search(message):  # a client reached no store: address, firewall, rank 0
        add("launch.store-unreachable", m, endpoint=_endpoint(m),
            errno=" ".join(g for g in m.group(7, 8) if g) or "timed out")


def _endpoint(m: re.Match | None) -> str:
    if not m:
        return ""
    host, port = [g for g in m.group(1, 2, 3, 4, 5, 6) if g] or ("", "")
    return f"{host}:{port}"


def openssl_release(number: str) -> str:
    """OpenSSL's OPENSSL_VERSION_NUMBER as ssh prints it, as a release: 0x30100010 -> 3.1.1
    (3.x: MNN00PP0), 0x1000207f -> 1.0.2g (1.x: MNNFFPPS, the patch a letter)."""
    v = int(number, 16)
    major, minor = v >> 28 & 0xF, v >> 20 & 0xFF
    if major >= 3:
        return f"{major}.{minor}.{v >> 4 & 0xFF}"
    letter = v >> 4 & 0xFF
    return f"{major}.{minor}.{v >> 12 & 0xFF}{chr(96 + letter) if letter else ''}"


def _read_ssh(message: str, add) -> None:
    # ssh that cannot run at all comes first: whatever the launcher says after it follows
    if m := _SSH_OPENSSL.search(message):
        add("launch.ssh-openssl-mismatch", m, built_against=openssl_release(m.group(1)),
            loaded=openssl_release(m.group(2)))
        return
    # The most specific ssh failure wins; pdsh's "exit code 255" only says ssh failed.
    if m := _SSH_FILE_MODES.search(message):
        add("launch.ssh-file-modes", m, path=m.group(1) or m.group(2))
    elif m := _SSHD_UNPREPARED.search(message):
        add("launch.sshd-unprepared-in-container", m, missing=m.group(1) or m.group(2)
            or "host keys")
    elif m := _SSH_HOSTKEY.search(message):
        add("launch.ssh-host-key", m, host=m.group(1) or "")
    elif m := _SSH_PUBKEY.search(message):
        add("launch.ssh-publickey", m, methods=m.group(2) or "password")
    elif m := _SSH_RESOLVE.search(message):
        add("launch.host-unreachable", m, host=m.group(1), error="does not resolve")
    elif m := _SSHD_MAXSTARTUPS.search(message):
        add("launch.sshd-maxstartups", m, stage="before the key exchange")
    elif m := _SSH_CONNECT.search(message):
        refused = m.group(3).strip().lower() == "connection refused"
        add("launch.sshd-refused" if refused else "launch.host-unreachable", m,
            host=m.group(1), port=m.group(2), error=m.group(3).strip())
    elif m := _SSH_CHECK.search(message):  # the runner's ssh check of the first host
        add("launch.host-unreachable", m, host=m.group(1) or m.group(2) or "",
            exit_status="255")
    elif (m := _PDSH_EXIT.search(message)) and m.group(2) in ("255", "127"):
        # 255: ssh itself failed; 127: the remote shell found no such command
        mode = "launch.host-unreachable" if m.group(2) == "255" else "launch.remote-paths-missing"
        add(mode, m, host=m.group(1), exit_status=m.group(2))


def _read_runner(message: str, add) -> None:
    if m := _PDSH_MISSING.search(message):
        add("launch.ds-pdsh-missing", m, launcher=m.group(1) or m.group(2))
    elif m := _PDSH_RCMD.search(message):  # pdsh's default rcmd module is not ssh
        add("launch.ds-pdsh-missing", m, rcmd_module=m.group(1) or "not ssh")
    if m := _NO_HOSTFILE.search(message):
        add("launch.ds-no-hostfile", m, hostfile="(none)")
    if m := _REMOTE_PATH.search(message):  # the same absolute path is run on every host
        add("launch.remote-paths-missing", m, path=next(g for g in m.groups() if g))
    if m := _PDSH_CMD.search(message):  # pdsh carries only what it exports
        names = re.findall(r"export (\w+)=", m.group(2))
        add("launch.ds-env-not-forwarded", m, hosts=m.group(1), exported=",".join(names))
