"""A real Slurm for tests: munge, slurmctld and slurmd on 127.0.0.1, or across namespaced hosts.

Everything lives in a temporary state directory (slurm.conf, spool, state, logs, the munge
socket) and the daemons are this module's own children, stopped by PID. Only one slurmd can
run per host, so there is one cluster at a time: :func:`start` restarts it when a test asks
for another configuration.

``pmix_library=False`` reproduces a node without the PMIx development library (Debian's
``libpmix-dev``: the unversioned ``libpmix.so`` that Slurm's pmix plugin dlopens): slurmd runs
in its own mount namespace where that one file is hidden, and :meth:`SlurmCluster.run` enters
the same namespace, so srun, the job steps and ``dsenv doctor`` all see the same machine.
The facts this is built on were measured here (slurm-wlm 22.05.8, Debian 12).

``hosts=N`` (2 to 4) makes the cluster multi-host: N namespaced hosts h1..hN from
:mod:`tests.harness.netns` (own hostname, /etc/hosts and mounts; fabric ``hsn0`` on 192.0.2.0/24,
management ``nmn0`` on 198.51.100.0/24), one slurmd per host (NodeName = its name, NodeAddr
its fabric address), slurmctld on h1, one sshd per host with a root key every host accepts,
and Debian's pdsh. h1 is also the login node: :meth:`SlurmCluster.run` runs commands there.
One munged serves all of them through its socket file (a path, so every network namespace
reaches it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dsenv.net import free_port
from tests.harness import netns

APT_PACKAGES = ("slurm-wlm", "munge", "libpmix-dev", "openssh-server", "openssh-client",
                "pdsh", "nftables", "iproute2")
START_TIMEOUT = 60.0
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE")


class SlurmUnavailable(Exception):
    """This machine cannot run the test cluster (not installable, not root...)."""


@dataclass(frozen=True)
class JobResult:
    job_id: int
    exit_code: int
    output: str
    state: str


def ensure_installed() -> None:
    """apt-get install Slurm, munge and PMIx when they are missing (root only)."""
    missing = [p for p in APT_PACKAGES if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True,
        timeout=30).stdout.strip() != "install ok installed"] if shutil.which("dpkg-query") else []
    if not missing and shutil.which("slurmctld"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SlurmUnavailable(f"Slurm is not installed ({', '.join(missing) or 'slurmctld'}) "
                               "and this is not a root Debian machine")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                              *missing], capture_output=True, text=True, timeout=900, env=env)
    if install.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600, env=env)
        install = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                  *missing], capture_output=True, text=True, timeout=900, env=env)
    if install.returncode != 0:
        raise SlurmUnavailable("apt-get install " + " ".join(missing) + " failed: "
                               + install.stderr.strip()[-300:])


def pmix_dev_library() -> Path | None:
    """The unversioned libpmix.so that libpmix-dev installs in the PMIx folder Slurm uses."""
    listing = subprocess.run(["dpkg", "-L", "libpmix-dev"], capture_output=True, text=True,
                             timeout=30)
    for line in listing.stdout.splitlines():
        path = Path(line.strip())
        if path.name == "libpmix.so" and "pmix" in path.parent.parent.name:
            return path
    return None


SLURM_CONF = """\
ClusterName=dsenvtest
SlurmctldHost={hostname}({ctld_address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/slurmd-%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
TmpFS={state}/tmp-%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault={mpi_default}
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
{node_lines}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, mpi_default: str = "none", pmix_library: bool = True, cpus: int = 4,
                 hosts: int = 0):
        self.mpi_default = mpi_default
        self.pmix_library = pmix_library
        self.cpus = cpus
        self.host_count = hosts
        self.state_dir = Path(tempfile.mkdtemp(prefix="dsenv-slurm-"))
        self.conf_path = self.state_dir / "slurm.conf"
        self.munge_socket = self.state_dir / "munge" / "munge.socket"
        self._daemons: dict[str, subprocess.Popen] = {}
        self._namespace_pid: int | None = None
        self.hosts: netns.Hosts | None = None

    @property
    def node_names(self) -> list[str]:
        return [h.name for h in self.hosts.hosts] if self.hosts else ["localhost"]

    # -- environment and commands --------------------------------------------------------
    def env(self, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_",
                                                                         "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf_path)
        env.update(extra or {})
        return env

    def _enter(self, argv, cwd=None) -> list[str]:
        if self.hosts is not None:  # the login node is h1
            return self.hosts.first.command(argv, cwd)
        if self._namespace_pid is None:
            return [str(a) for a in argv]
        return ["nsenter", f"--target={self._namespace_pid}", "--mount", "--",
                *[str(a) for a in argv]]

    def run(self, argv, *, timeout: float, env=None, cwd=None) -> subprocess.CompletedProcess:
        """Run a client command (srun, sbatch, dsenv ...) as this cluster's nodes see the host."""
        return subprocess.run(self._enter(argv, cwd), capture_output=True, text=True,
                              timeout=timeout,
                              env=env if env is not None else self.env(), cwd=cwd)

    def sbatch(self, script: Path, *, timeout: float, cwd=None, args=(), env=None) -> JobResult:
        """Submit, wait for the end, and return exit code, state and the job's output."""
        output = Path(tempfile.mkstemp(prefix="job-", suffix=".out", dir=self.state_dir)[1])
        submitted = self.run(["sbatch", "--parsable", f"--output={output}", *args, str(script)],
                             timeout=60, env=env, cwd=cwd)
        job_id = submitted.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise RuntimeError(f"sbatch failed (rc {submitted.returncode}): "
                               f"{submitted.stderr.strip()}")
        fields = self.wait(int(job_id), timeout=timeout)
        code = int(fields.get("ExitCode", "-1:0").split(":")[0])
        return JobResult(int(job_id), code, output.read_text(errors="replace"),
                         fields.get("JobState", "UNKNOWN"))

    def wait(self, job_id: int, *, timeout: float) -> dict[str, str]:
        """Poll until the job ends; its `scontrol show job` fields (`sbatch --wait` backs off
        to ~30 s between polls, which made every test job look half a minute longer)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.run(["scontrol", "show", "job", str(job_id)], timeout=30).stdout
            fields = dict(t.split("=", 1) for t in shown.split() if "=" in t)
            if fields.get("JobState") in FINAL_STATES:
                return fields
            time.sleep(0.5)
        self.run(["scancel", str(job_id)], timeout=30)
        raise TimeoutError(f"job {job_id} did not end within {timeout:.0f} s (cancelled)")

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        ensure_installed()
        if os.geteuid() != 0:
            raise SlurmUnavailable("the test cluster runs its daemons as root")
        for sub in ("ctld", "slurmd", "munge"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            if self.host_count:
                self.hosts = netns.Hosts(self.host_count, self.state_dir / "hosts").start()
                for name, proc in netns.start_ssh(self.hosts).items():
                    self._daemons[f"sshd-{name}"] = proc
            self._start_munge()
            self._write_conf()
            self._start_daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf_path)],
                               host=self.hosts.first if self.hosts else None)
            self._start_slurmd()
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        folder = self.munge_socket.parent
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        shutil.chown(key, "munge", "munge")
        shutil.chown(folder, "munge", "munge")
        folder.chmod(0o700)
        self.state_dir.chmod(0o755)
        self._start_daemon("munged", [
            "munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}"], user="munge")
        self._wait_for(lambda: self.munge_socket.exists(), "munged to open its socket")

    def _write_conf(self) -> None:
        if self.hosts:
            # Slurm on the management network, the ranks on the fabric, as on real clusters
            nodes = [(h.name, h.management_ip) for h in self.hosts.hosts]
            ctld = nodes[0]
        else:
            nodes = [("localhost", "127.0.0.1")]
            ctld = (socket.gethostname(), "127.0.0.1")
        # Each host has a network namespace of its own, so one fixed port serves them all.
        self.conf_path.write_text(SLURM_CONF.format(
            hostname=ctld[0], ctld_address=ctld[1], ctld_port=free_port(),
            slurmd_port=free_port(), munge_socket=self.munge_socket, state=self.state_dir,
            mpi_default=self.mpi_default,
            node_lines="\n".join(f"NodeName={name} NodeAddr={address} CPUs={self.cpus} "
                                  "State=UNKNOWN" for name, address in nodes),
            node_names=",".join(name for name, _ in nodes)))

    def _start_slurmd(self) -> None:
        for name in self.node_names:
            # %n folders: each node's spool and its job-local temporary folder (PMIx makes
            # spmix_appdir_UID_JOB.STEP there: one shared /tmp would collide across hosts).
            (self.state_dir / f"slurmd-{name}").mkdir(exist_ok=True)
            (self.state_dir / f"tmp-{name}").mkdir(exist_ok=True)
        if self.hosts:
            for host in self.hosts.hosts:
                self._start_daemon(f"slurmd-{host.name}", ["slurmd", "-D", "-f",
                                   str(self.conf_path), "-N", host.name], host=host)
            return
        argv = ["slurmd", "-D", "-f", str(self.conf_path), "-N", "localhost"]
        if self.pmix_library:
            self._start_daemon("slurmd", argv)
            return
        library = pmix_dev_library()
        if library is None:
            raise SlurmUnavailable("libpmix-dev lists no libpmix.so to hide")
        # A copy of the PMIx folder without libpmix.so, bound over the real one in a private
        # mount namespace: the node looks exactly like one where libpmix-dev is not installed.
        replica = self.state_dir / "pmix-lib-without-dev"
        shutil.copytree(library.parent, replica, symlinks=True)
        (replica / library.name).unlink()
        hide = (f"mount --bind {replica} {library.parent} && exec "
                + " ".join(argv))
        self._start_daemon("slurmd", ["unshare", "--mount", "--propagation", "private",
                                      "sh", "-c", hide])
        self._namespace_pid = self._daemons["slurmd"].pid

    def _start_daemon(self, name: str, argv: list[str], user: str | None = None,
                      host: netns.Host | None = None) -> None:
        log = open(self.state_dir / f"{name}.stdout", "wb")
        if host is not None:
            argv = host.command(argv)
        self._daemons[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, user=user,
                                               start_new_session=True, env=self.env())

    def _wait_for(self, ready, what: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._daemons.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited (rc {proc.returncode}) while waiting "
                                           f"for {what}: {self.log_tail(name)}")
            if ready():
                return
            time.sleep(0.2)
        raise SlurmUnavailable(f"timed out after {timeout:.0f} s waiting for {what}: "
                               + " | ".join(self.log_tail(n) for n in self._daemons))

    def node_state(self) -> str:
        """`idle` when every node is idle, else the states sinfo shows."""
        shown = self.run(["sinfo", "-h", "-N", "-o", "%T", "-n", ",".join(self.node_names)],
                         timeout=15)
        states = set(shown.stdout.split())
        return "idle" if states == {"idle"} and len(shown.stdout.split()) == len(
            self.node_names) else " ".join(sorted(states))

    def _wait_idle(self) -> None:
        self._wait_for(lambda: self.node_state() == "idle", "every node to be idle")

    def log_tail(self, name: str, chars: int = 400) -> str:
        for candidate in (self.state_dir / f"{name}.log", self.state_dir / f"{name}-h1.log", self.state_dir / f"{name}.stdout",
                          self.munge_socket.parent / f"{name}.log"):
            if candidate.is_file() and candidate.stat().st_size:
                return f"{name}: " + candidate.read_text(errors="replace")[-chars:].strip()
        return f"{name}: (no log)"

    def stop(self) -> None:
        """Stop this cluster's own daemons (by PID, newest first) and remove its state."""
        for proc in reversed(list(self._daemons.values())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)
        self._daemons.clear()
        self._namespace_pid = None
        if self.hosts is not None:
            self.hosts.stop()
            self.hosts = None
        shutil.rmtree(self.state_dir, ignore_errors=True)


_current: SlurmCluster | None = None


def start(mpi_default: str = "none", pmix_library: bool = True,
          hosts: int = 0) -> SlurmCluster:
    """The running test cluster with this configuration (restarted when it differs)."""
    global _current
    if _current is not None:
        if (_current.mpi_default, _current.pmix_library, _current.host_count) == (
                mpi_default, pmix_library, hosts):
            return _current
        _current.stop()
        _current = None
    _current = SlurmCluster(mpi_default, pmix_library, hosts=hosts).start()
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None


def demo(argv: list[str] | None = None) -> int:
    """`python -m tests.harness.slurmcluster --hosts 2`: the test cluster by hand, until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.harness.slurmcluster",
                                     description="Start the test Slurm (namespaced hosts with "
                                     "--hosts N), print how to use it, tear it down on Ctrl-C.")
    parser.add_argument("--hosts", type=int, default=2, help="2 to 4 namespaced hosts; 0: "
                        "one node on 127.0.0.1")
    args = parser.parse_args(argv)
    cluster = SlurmCluster(hosts=args.hosts).start()
    try:
        print(f"cluster up: nodes {', '.join(cluster.node_names)}; SLURM_CONF="
              f"{cluster.conf_path}")
        if cluster.hosts:
            for host in cluster.hosts.hosts:
                print(f"  {host.name}: hsn0 {host.fabric_ip}, nmn0 {host.management_ip}; a "
                      f"shell there: nsenter --target={host.pid} --net --uts --mount bash")
            print(f"  from h1: SLURM_CONF={cluster.conf_path} srun -N{args.hosts} hostname; "
                  "ssh h2; pdsh -R ssh -w h[1-2] hostname")
        print("Ctrl-C stops it and removes every namespace, daemon and file.")
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(demo())
