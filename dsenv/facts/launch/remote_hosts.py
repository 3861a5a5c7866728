"""Facts from every host of a multi-node job, gathered in one round before the launch.

What decides a multi-node launch lives on the other hosts: whether ssh reaches them (the
deepspeed launcher's pdsh does), whether the ranks' interpreter and the launch folder exist
there, whether MASTER_ADDR resolves there and through which interface, whether the interface
and HCA names in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / NCCL_IB_HCA exist there.

One small standard-library program (:data:`HOST_PROBE`) answers all of it as one JSON line.
It reaches the hosts the way the launcher will: over ``ssh -o BatchMode=yes`` (DeepSpeed's
pdsh runner, mpirun's rsh agent), or with one ``srun --overlap`` step over the allocation
(srun, torchrun, mpirun under Slurm). Hosts are asked in parallel with a bounded pool, each
with a timeout, so N hosts cost about one round trip, and a silent host is named rather than
waited for.
"""

from __future__ import annotations

import json
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dsenv.facts.launch.joblayout import allocated_hosts, planned_nodes, short_name
from dsenv.facts.node import Node

SSH_CONNECT_TIMEOUT = 5  # seconds (ssh ConnectTimeout)
MAX_PARALLEL = 64  # ssh sessions at once: bounded for 1,000 hosts (sshd's MaxStartups is 10:30:100)

# Runs on each host with the host's python3; standard library only, no dsenv needed there.
HOST_PROBE = r"""
import json, os, socket, struct, sys
try:
    import fcntl
except ImportError:
    fcntl = None
names, paths = json.loads(sys.argv[1])
def v4(name):
    if fcntl is None:
        return None
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None
    finally:
        s.close()
interfaces = {}
for _, name in socket.if_nameindex():
    try:
        state = open("/sys/class/net/%s/operstate" % name).read().strip()
    except OSError:
        state = "unknown"
    address = v4(name)
    interfaces[name] = {"state": state, "addresses": [address] if address else []}
resolved = {}
for name in names:
    try:
        found = sorted({i[4][0] for i in socket.getaddrinfo(name, None, socket.AF_INET)})
    except OSError as exc:
        resolved[name] = {"error": str(exc)}
        continue
    route = None
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((found[0], 9))  # UDP connect sends nothing: the kernel picks the route
        source = s.getsockname()[0]
        route = next((n for n, i in interfaces.items() if source in i["addresses"]), source)
    except OSError as exc:
        route = "unreachable: %s" % exc
    finally:
        s.close()
    resolved[name] = {"addresses": found, "interface": route}
try:
    hcas = sorted(os.listdir("/sys/class/infiniband"))
except OSError:
    hcas = []
found_paths = {p: {"exists": os.path.exists(p), "dir": os.path.isdir(p),
                   "exec": os.path.isfile(p) and os.access(p, os.X_OK)} for p in paths}
print("DSENV-HOST " + json.dumps({"host": socket.gethostname(), "interfaces": interfaces,
                                   "resolved": resolved, "hcas": hcas, "paths": found_paths}))
"""


@dataclass
class HostFacts:
    host: str  # as the allocation or the hostfile names it
    error: str = ""  # why the host did not answer
    hostname: str = ""
    interfaces: dict = field(default_factory=dict)  # name -> {"state", "addresses"}
    resolved: dict = field(default_factory=dict)  # name -> {"addresses", "interface"}|{"error"}
    hcas: list = field(default_factory=list)
    paths: dict = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        return not self.error


@dataclass
class Survey:
    hosts: list[HostFacts]
    transport: str  # "ssh" | "srun" | "" (not gathered)
    why: str  # where the host list came from, or why nothing was gathered
    seconds: float = 0.0

    @property
    def answered(self) -> list[HostFacts]:
        return [h for h in self.hosts if h.answered]

    @property
    def silent(self) -> list[HostFacts]:
        return [h for h in self.hosts if not h.answered]


def parse_answer(host: str, text: str) -> HostFacts:
    for line in text.splitlines():
        if line.startswith("DSENV-HOST "):
            data = json.loads(line[len("DSENV-HOST "):])
            return HostFacts(host, hostname=data["host"], interfaces=data["interfaces"],
                             resolved=data["resolved"], hcas=data["hcas"],
                             paths=data["paths"])
    return HostFacts(host, error="no answer from the probe")


def _last_line(text: str) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1][:200] if lines else "no output"


def ssh_argv(host: str, remote: str) -> list[str]:
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}",
            host, remote]


def _remote_command(names: list[str], paths: list[str]) -> str:
    return shlex.join(["python3", "-c", HOST_PROBE, json.dumps([names, paths])])


def ask_over_ssh(node: Node, hosts: list[str], names: list[str], paths: list[str],
                 timeout: float) -> list[HostFacts]:
    remote = _remote_command(names, paths)

    def one(host: str) -> HostFacts:
        result = node.run(ssh_argv(host, remote), timeout=timeout)
        if result.timed_out:
            return HostFacts(host, error=f"no answer within {timeout:.0f} s (ssh hung)")
        if result.returncode == 255:  # ssh's own failure, not the probe's
            lines = (result.stderr or "").strip().splitlines()
            return HostFacts(host, error="ssh failed: " + (lines[-1] if lines else "exit 255"))
        if not result.ok and "DSENV-HOST " not in (result.stdout or ""):
            return HostFacts(host, error=f"the probe exited {result.returncode}: "
                             + _last_line(result.stderr or result.stdout))
        return parse_answer(host, result.stdout or "")

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def ask_over_srun(node: Node, hosts: list[str], names: list[str], paths: list[str],
                  timeout: float) -> list[HostFacts]:
    """One job step, one task per node, inside this allocation (--overlap: the job's own
    steps keep their CPUs)."""
    argv = ["srun", "--overlap", "--nodes", str(len(hosts)), "--ntasks", str(len(hosts)),
            "--ntasks-per-node", "1", "--kill-on-bad-exit=0", "--wait", str(int(timeout)),
            "python3", "-c", HOST_PROBE, json.dumps([names, paths])]
    result = node.run(argv, timeout=timeout + 5)
    answers = {}
    for line in (result.stdout or "").splitlines():
        if line.startswith("DSENV-HOST "):
            facts = parse_answer("", line)
            answers[short_name(facts.hostname)] = facts
    out = []
    for host in hosts:
        facts = answers.get(short_name(host))
        if facts is None:
            why = ("no answer within the timeout" if result.timed_out else
                   f"no answer from its srun task (srun exited {result.returncode}: "
                   f"{_last_line(result.stderr)})")
            out.append(HostFacts(host, error=why))
        else:
            facts.host = host
            out.append(facts)
    return out


def job_hosts(node: Node, hostfile_hosts: list[str]) -> tuple[list[str], str]:
    allocated = allocated_hosts(node)
    if allocated:
        return allocated, f"SLURM_JOB_NODELIST={node.env.get('SLURM_JOB_NODELIST', '')}"
    if hostfile_hosts:
        return hostfile_hosts, "the hostfile"
    return [], "no allocation and no hostfile"


def survey(node: Node, *, transport: str, hostfile_hosts: list[str], names: list[str],
           paths: list[str]) -> Survey:
    """Every host's facts, once per doctor run (memoised on the arguments)."""
    key = f"remote_hosts:{transport}:{','.join(hostfile_hosts)}:{names}:{paths}"
    return node.memo(key, lambda: _survey(node, transport, hostfile_hosts, names, paths))


def _survey(node, transport, hostfile_hosts, names, paths) -> Survey:
    hosts, why = job_hosts(node, hostfile_hosts)
    nodes = planned_nodes(node).value or 1
    if len(hosts) < 2 or nodes < 2 and not hostfile_hosts:
        return Survey([], "", why if len(hosts) < 2 else "one node planned")
    if transport == "srun" and not node.env.get("SLURM_JOB_ID"):
        return Survey([], "", "outside a Slurm allocation: srun cannot reach the hosts yet")
    timeout = max(node.probe_timeout, SSH_CONNECT_TIMEOUT + 5)
    started = time.monotonic()
    ask = ask_over_ssh if transport == "ssh" else ask_over_srun
    facts = ask(node, hosts, names, paths, timeout)
    return Survey(facts, transport, why, time.monotonic() - started)
