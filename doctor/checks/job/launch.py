"""launch: what the launcher needs before the first rank starts, checked on this node.

The rendezvous address and port (MASTER_ADDR, MASTER_PORT) and, for DeepSpeed's launcher on
more than one node, its pdsh runner: pdsh and ssh, a hostfile the runner accepts, and the
variables it will not carry to the other hosts. The rules are DeepSpeed's own
(deepspeed/launcher/runner.py, read by :mod:`..probes.dsrunner`).
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import socket
from pathlib import Path

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.envs.launchers import needed_on_remote_hosts
from dsenv.facts.comm import netaddr
from dsenv.facts.launch import dsrunner, joblayout
from dsenv.net import free_port
from dsenv.redact import show_variable
from dsenv.verdicts.findings import fail, info, ok, skip, warn

MASTER_ADDR_FIX = ('export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | '
                   "head -n 1) in the batch script, before the launcher")
PORT_FIX = ("export MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000)) (a port per job) in the batch "
            "script, or pass --master_port to the launcher")
FREE_PORT_FIX = "export MASTER_PORT={port} (free on this node now), or pass --master_port {port}"
SLURM_LAUNCHER_FIX = ("pass `--launcher slurm` to the deepspeed runner (srun starts the ranks: "
                      "no pdsh and no ssh between nodes), or start the ranks with "
                      "`dsenv launch --launcher srun`")
SSH_TIMEOUT = 5  # seconds ssh may take to connect (ConnectTimeout)


def _severe(ctx: Context):
    """fail on a compute target, warn on a login node (it plans; the job runs elsewhere)."""
    return fail if ctx.is_compute else warn


def multi_node(ctx: Context) -> tuple[bool, str]:
    """More than one node: --nodes, SLURM_NNODES, else (DeepSpeed's launcher or none named)
    a hostfile listing several hosts."""
    nodes = joblayout.planned_nodes(ctx)
    if nodes.value is None and ctx.options.launcher in (None, "deepspeed"):
        hostfile = dsrunner.hostfile(ctx)
        if len(hostfile.hosts) > 1:
            return True, f"{hostfile.path} lists {len(hostfile.hosts)} hosts"
    return (nodes.value or 1) > 1, nodes.source


def _master_addr_timeout(ctx: Context) -> float:
    return min(ctx.options.probe_timeout, 5.0)


# -- MASTER_ADDR --------------------------------------------------------------------------------


RDZV = "launch.rdzv-timeout"  # the catalogue mode of launch.master-addr's findings


@check("launch.master-addr", "MASTER_ADDR reaches the first node from every node")
def master_addr(ctx: Context):
    multi, why = multi_node(ctx)
    value = ctx.env.get("MASTER_ADDR", "").strip()
    if not multi:
        return skip(f"one node ({why}): the rendezvous may stay on loopback")
    if not value:
        if ctx.options.launcher == "deepspeed":
            return info("MASTER_ADDR is not set: DeepSpeed's runner asks the first hostfile host "
                        "for its address over ssh (`hostname -I`), or takes --master_addr", why)
        if not ctx.is_compute:
            return info("MASTER_ADDR is not set here: the batch script sets it on the first "
                        "node (`dsenv launch` does)", why)
        return mode_finding(warn, RDZV, f"MASTER_ADDR is not set for a {why} job: the ranks "
                            "have no rendezvous address", why, here=MASTER_ADDR_FIX)
    shown = show_variable("MASTER_ADDR", value)
    evidence = [why]
    if value.lower() in netaddr.LOOPBACK_NAMES or netaddr.is_loopback(value):
        return mode_finding(_severe(ctx), RDZV, f"{shown} with {why}: every node meets itself "
                            "at loopback and waits for ranks that never come "
                            "(init_process_group hangs)", *evidence, here=MASTER_ADDR_FIX)
    found = netaddr.resolve_once(ctx, value, _master_addr_timeout(ctx))
    if found.error:
        return _severe(ctx)(f"{shown} does not resolve here: {found.error}",
                            "use the first node's name as `scontrol show hostnames` prints it, "
                            "or its address: " + MASTER_ADDR_FIX, *evidence)
    evidence.append(f"{value} -> {', '.join(found.addresses)} ({found.seconds:.2f} s)")
    if all(netaddr.is_loopback(a) for a in found.addresses):
        return mode_finding(_severe(ctx), RDZV, f"{shown} resolves to loopback "
                            f"({', '.join(found.addresses)}): the other nodes cannot reach it (a "
                            "hostname mapped to 127.0.1.1 in /etc/hosts does this)", *evidence,
                            here="set MASTER_ADDR to the first node's address on the fabric the "
                            "ranks use (`hostname -I`), or fix /etc/hosts")
    hosts = joblayout.allocated_hosts(ctx)
    if hosts and not netaddr.is_address(value):
        here = any(netaddr.is_local_address(a) for a in found.addresses)
        if not here and not names_allocated_host(value, hosts):
            return mode_finding(warn, RDZV, f"{shown} is not one of the allocated nodes "
                                f"({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''}): "
                                "the ranks would meet on a host outside the job", *evidence,
                                f"SLURM_JOB_NODELIST={ctx.env.get('SLURM_JOB_NODELIST')}",
                                here=MASTER_ADDR_FIX)
    return ok(f"{shown} resolves to {', '.join(found.addresses)} (not loopback)", *evidence)


def names_allocated_host(name: str, hosts: list[str]) -> bool:
    """'nid01', 'nid01.cluster' and a site's interface name 'nid01-ib' name node nid01;
    'nid010' does not."""
    short = joblayout.short_name(name)
    return any(re.match(re.escape(joblayout.short_name(h)) + r"(\D|$)", short) for h in hosts)


# -- MASTER_PORT ----------------------------------------------------------------------------------


def _port(ctx: Context) -> tuple[int | None, str]:
    text = ctx.env.get("MASTER_PORT", "").strip()
    if not text:
        return netaddr.DEFAULT_MASTER_PORT, f"MASTER_PORT unset: the default {netaddr.DEFAULT_MASTER_PORT}"
    if text.isdigit() and 0 < int(text) < 65536:
        return int(text), show_variable("MASTER_PORT", text)
    return None, show_variable("MASTER_PORT", text)


def _port_fix(ctx: Context) -> str:
    return PORT_FIX if ctx.env.get("SLURM_JOB_ID") else FREE_PORT_FIX.format(port=free_port())


def _local_master(ctx: Context) -> tuple[list[str] | None, str]:
    """MASTER_ADDR's addresses when they are this host's; None when it names another host."""
    value = ctx.env.get("MASTER_ADDR", "").strip()
    if not value:
        return [], "MASTER_ADDR unset: the rendezvous is on this node"
    found = netaddr.resolve_once(ctx, value, _master_addr_timeout(ctx))
    if found.error:  # launch.master-addr reports it; the port is still worth checking here
        return [], f"MASTER_ADDR={value} does not resolve: checking this node"
    local = [a for a in found.addresses if netaddr.is_local_address(a)]
    if not local:
        return None, f"MASTER_ADDR={value} ({', '.join(found.addresses)}) is another host"
    return local, f"MASTER_ADDR={value} is this host ({', '.join(local)})"


@check("launch.port", "MASTER_PORT free on the first node")
def master_port(ctx: Context):
    if not ctx.is_compute:
        return skip("login node: the rendezvous port is opened on the job's first node")
    port, shown = _port(ctx)
    if port is None:
        return fail(f"{shown} is not a TCP port (1-65535)", _port_fix(ctx))
    local, where = _local_master(ctx)
    if local is None:
        return skip(f"{where}: its port is checked there", shown)
    addresses = list(dict.fromkeys(["127.0.0.1", *[a for a in local if not netaddr.is_loopback(a)],
                                    "0.0.0.0"]))
    errors = {a: netaddr.bind_error(a, port) for a in addresses}
    busy = [a for a, e in errors.items() if netaddr.in_use(e)]
    evidence = [shown, where] + [f"bind {a}:{port}: {e or 'free'}" for a, e in errors.items()]
    if busy:
        holders = netaddr.listeners(ctx, port)
        owners = netaddr.socket_owners(ctx, {h.inode for h in holders})
        evidence += [f"listening: {h.address}:{h.port} (uid {h.uid}, inode {h.inode})"
                     for h in holders]
        if owners and all(o.pid == os.getpid() for o in owners):
            # `dsenv doctor --distributed`: rank 0's own rendezvous store listens there
            return ok(f"port {port} is held by this doctor's own rendezvous (rank 0 of "
                      "--distributed)", *evidence)
        who = ("held by " + ", ".join(o.describe() for o in owners) if owners else
               "by a process this user cannot see (another user's job?)" if holders else
               "no listener in /proc/net/tcp: another network namespace?")
        # a Python process on the port is most likely another run's TCPStore: ranks of this
        # run that reach it join that store (more ranks than world_size) instead of failing
        store = any(re.search(r"python|torchrun|deepspeed", o.describe(), re.I) for o in owners)
        return mode_finding(fail, "launch.store-shared" if store else "launch.port-in-use",
                            f"port {port} is already in use on this node ({who}): the "
                            "rendezvous fails with EADDRINUSE ('The server socket has failed to "
                            "listen')", *evidence, here=_port_fix(ctx))
    other = {a: e for a, e in errors.items() if e is not None}
    if other:
        address, error = next(iter(other.items()))
        return refused_port(port, address, error, evidence, _port_fix(ctx))
    return ok(f"port {port} is free on this node", *evidence)


def refused_port(port: int, address: str, error: OSError, evidence: list[str], here: str):
    """The verdict on a bind refused for another reason than a listener: EACCES below 1024 is
    Linux's privileged-port rule (only root, or CAP_NET_BIND_SERVICE, binds there)."""
    if error.errno == errno.EACCES and port < 1024:
        return mode_finding(fail, "launch.privileged-port",
                            f"port {port} is privileged (below 1024): this user's bind on "
                            f"{address} is refused ({error}), as rank 0's TCPStore will be",
                            *evidence, here=here)
    return fail(f"port {port} cannot be bound on {address}: {error}", here, *evidence)


# -- DeepSpeed's pdsh runner -----------------------------------------------------------------------


def pdsh_launch(ctx: Context) -> tuple[bool, str]:
    """Whether DeepSpeed's runner starts the ranks of other hosts with pdsh, and why (not)."""
    launcher = ctx.options.launcher
    if launcher not in (None, "deepspeed"):
        return False, f"launcher {launcher}: DeepSpeed's pdsh runner is not used"
    hostfile = dsrunner.hostfile(ctx)
    multi, why = multi_node(ctx)
    if launcher == "deepspeed" and multi:
        return True, f"the deepspeed launcher on more than one node ({why})"
    if len(hostfile.hosts) > 1:
        return True, (f"{hostfile.path} lists {len(hostfile.hosts)} hosts"
                      + ("" if launcher else " and DeepSpeed's runner defaults to pdsh"))
    if launcher is None:
        return False, "no --launcher deepspeed and no multi-host hostfile"
    return False, "one node: DeepSpeed's runner starts every rank locally, without pdsh"


def parse_rcmd_modules(text: str) -> list[str] | None:
    """'rcmd modules: ssh,exec (default: ssh)' (pdsh -V; -h says 'available rcmd modules')."""
    match = re.search(r"rcmd modules:\s*([^\n(]*)", text)
    return [m.strip() for m in match.group(1).split(",") if m.strip()] if match else None


def ssh_failure_mode(words: str) -> str | None:
    """The catalogue mode of ssh's own refusal to start: a libcrypto other than the one it
    was built against (its version check), or one without the symbols it needs."""
    if "OpenSSL version mismatch" in words:
        return "launch.ssh-openssl-mismatch"
    if re.search(r"symbol lookup error|undefined symbol", words) and re.search(
            r"crypto|ssl|EVP_|OPENSSL", words, re.I):
        return "loader.foreign-openssl-shadows-system"
    return None


def ssh_cannot_start(ctx: Context, evidence: list[str]):
    """`ssh -V` in the job's environment: a conda env's (or a module's) lib/ on
    LD_LIBRARY_PATH hands the system ssh its own libcrypto, and ssh dies before it connects
    (conda/conda#10241, modin-project/unidist#314). None when ssh starts."""
    ran = ctx.run(["ssh", "-V"])
    if ran.ok:
        evidence.append(f"ssh -V: {(ran.stderr or ran.stdout).strip().splitlines()[-1:]}")
        return None
    words = (ran.stderr or ran.stdout or ran.describe()).strip()
    folders = [f for f in ctx.env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
               if f and any(Path(f).glob("libcrypto.so*"))]
    lines = [*evidence, f"`ssh -V` in the job's environment: {words.splitlines()[-1]}"]
    if folders:
        lines.append("libcrypto on LD_LIBRARY_PATH: " + ", ".join(folders))
    summary = "ssh cannot start in the job's environment: pdsh reaches no other host"
    mode = ssh_failure_mode(words)
    here = (f"take {', '.join(folders)} off LD_LIBRARY_PATH for the launcher (conda does not "
            "need it there)" if folders else ())
    # each mode id written out: the catalogue's cross-check reads them as literals
    # (tests/test_catalogue_fixes.py), so the branches are not folded into one call
    if mode == "launch.ssh-openssl-mismatch":
        return mode_finding(_severe(ctx), "launch.ssh-openssl-mismatch", summary, *lines,
                            here=here)
    if mode == "loader.foreign-openssl-shadows-system":
        return mode_finding(_severe(ctx), "loader.foreign-openssl-shadows-system", summary,
                            *lines, here=here)
    return _severe(ctx)(summary, SLURM_LAUNCHER_FIX, *lines)


def _other_host(hosts: list[str]) -> str | None:
    here = {joblayout.short_name(socket.gethostname()), "localhost", "127.0.0.1"}
    return next((h for h in hosts if joblayout.short_name(h) not in here), None)


PDSH = "launch.ds-pdsh-missing"  # the catalogue mode of pdsh missing or without ssh


@check("launch.pdsh", "pdsh and ssh for DeepSpeed's multi-node launcher")
def pdsh(ctx: Context):
    uses, why = pdsh_launch(ctx)
    if not uses:
        return skip(why)
    found = ctx.which("pdsh")
    if not found:
        return mode_finding(_severe(ctx), PDSH, "pdsh is not on PATH: DeepSpeed's runner stops "
                            "with \"launcher 'pdsh' not installed\"", why,
                            here=SLURM_LAUNCHER_FIX)
    evidence = [why, f"pdsh: {found}"]
    version = ctx.run(["pdsh", "-V"])
    modules = parse_rcmd_modules(version.stdout + version.stderr)
    if modules is not None:
        evidence.append("pdsh rcmd modules: " + ", ".join(modules))
        if "ssh" not in modules:
            return mode_finding(_severe(ctx), PDSH, "pdsh has no ssh rcmd module, and "
                                "DeepSpeed runs it with PDSH_RCMD_TYPE=ssh", *evidence,
                                here="install pdsh's ssh module (the pdsh-rcmd-ssh package on "
                                "EPEL), or " + SLURM_LAUNCHER_FIX)
    if not ctx.which("ssh"):
        return mode_finding(_severe(ctx), PDSH, "ssh is not on PATH: pdsh cannot reach the "
                            "other hosts", *evidence, here=SLURM_LAUNCHER_FIX)
    if broken := ssh_cannot_start(ctx, evidence):
        return broken
    host = _other_host(list(dsrunner.hostfile(ctx).hosts))
    if host is None:
        return ok("pdsh (with ssh) is on PATH; no other host in the hostfile to try ssh on",
                  *evidence)
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT}", host, "true"]
    result = ctx.run(argv, timeout=min(ctx.options.probe_timeout, SSH_TIMEOUT + 5))
    evidence.append(result.describe() if not result.ok else f"`{shlex.join(argv)}`: ok")
    if not result.ok:
        return _severe(ctx)(f"no passwordless ssh to {host}: pdsh cannot start its ranks "
                            "(`ssh exited with exit code 255`)", SLURM_LAUNCHER_FIX, *evidence)
    return ok(f"pdsh (with ssh) is on PATH and ssh reaches {host} without a password", *evidence)


@check("launch.ds-hostfile", "Hostfile for DeepSpeed's multi-node launcher")
def ds_hostfile(ctx: Context):
    if ctx.options.launcher != "deepspeed":
        return skip("only DeepSpeed's launcher reads a hostfile (--launcher deepspeed)")
    hostfile = dsrunner.hostfile(ctx)
    multi, why = multi_node(ctx)
    ranks = joblayout.ranks_per_node(ctx)
    evidence = [why, f"hostfile: {hostfile.path} ({hostfile.source})"]
    make = ('scontrol show hostnames "$SLURM_JOB_NODELIST" | sed \'s/$/ slots='
            f'{ranks.value or 4}/\' > hostfile and pass --hostfile hostfile')
    if not multi:
        other = _other_host(list(hostfile.hosts))
        if other:
            return warn(f"one node planned, but {hostfile.path} lists {other}: the runner "
                        "ssh-checks it and launches there unless told --num_nodes 1",
                        f"pass --num_nodes 1 --no_ssh_check, or move {hostfile.path} away",
                        *evidence)
        return skip(f"one node ({why}): no hostfile needed")
    if not hostfile.exists:
        return mode_finding(_severe(ctx), "launch.ds-no-hostfile",
                            f"no hostfile at {hostfile.path}: DeepSpeed warns 'Unable to find "
                            "hostfile, will proceed with training with local resources only' "
                            "and trains on this node alone", *evidence, here=make)
    if hostfile.error:
        return _severe(ctx)(f"{hostfile.path}: {hostfile.error} (DeepSpeed refuses to launch)",
                            make, *evidence)
    hosts = hostfile.hosts
    evidence.append("hosts: " + ", ".join(f"{h} slots={s}" for h, s in hosts.items()))
    nodes = joblayout.planned_nodes(ctx).value or 1
    if len(hosts) < nodes:
        return _severe(ctx)(f"{hostfile.path} lists {len(hosts)} host(s) for {nodes} nodes: "
                            "the runner cannot place the other ranks", make, *evidence)
    allocated = joblayout.allocated_hosts(ctx)
    if allocated:
        names = {joblayout.short_name(h) for h in allocated}
        outside = [h for h in hosts if joblayout.short_name(h) not in names]
        if outside:
            return _severe(ctx)(f"{hostfile.path} names host(s) outside this allocation: "
                                f"{', '.join(outside)}", make, *evidence,
                                f"allocated: {', '.join(allocated)}")
        listed = {joblayout.short_name(h) for h in hosts}
        idle = [h for h in allocated if joblayout.short_name(h) not in listed]
        if idle:
            return _severe(ctx)(f"{hostfile.path} leaves out allocated host(s) "
                                f"{', '.join(idle[:6])}: no rank starts there (they idle "
                                "while the job is billed for them)", make, *evidence,
                                f"allocated: {', '.join(allocated)}")
    if not Path(hostfile.path).is_absolute():
        absolute = Path(hostfile.path).absolute()
        return warn(f"hostfile {hostfile.path} is a relative path: the runner reads it from "
                    "the folder it is started in", f"pass --hostfile {absolute}", *evidence)
    if ranks.value and any(s < ranks.value for s in hosts.values()):
        short = [f"{h} slots={s}" for h, s in hosts.items() if s < ranks.value]
        return _severe(ctx)(f"{', '.join(short)}: fewer slots than the {ranks.value} ranks per "
                            "node planned, so fewer ranks start", make, *evidence)
    return ok(f"{hostfile.path} lists {len(hosts)} host(s) with slots", *evidence)


# -- variables the pdsh runner does not carry -------------------------------------------------------


def needed_variables(ctx: Context) -> dict[str, str]:
    """Variables set here that the ranks on the other hosts are likely to need."""
    needed = {n: v for n, v in ctx.env.items() if v and needed_on_remote_hosts(n)}
    env_bins = [str(Path(ctx.env[n]) / "bin") for n in ("DSENV_ENV", "VIRTUAL_ENV", "CONDA_PREFIX")
                if ctx.env.get(n)]
    path = ctx.env.get("PATH", "").split(os.pathsep)
    if any(b in path for b in env_bins):  # an activated environment: a login shell lacks it
        needed["PATH"] = ctx.env["PATH"]
    return needed


@check("launch.ds-env", "Variables DeepSpeed's pdsh runner carries to other hosts")
def ds_env(ctx: Context):
    uses, why = pdsh_launch(ctx)
    if not uses:
        return skip(why)
    rules = dsrunner.export_rules(ctx)
    files = dsrunner.env_files(ctx, Path.cwd())
    evidence = [why, f"exported by prefix: {', '.join(rules.prefixes)} ({rules.source})"]
    evidence += [f"{f.path}: {', '.join(f.values) or 'no variables'}" for f in files]
    broken = [f for f in files if f.bad_lines]
    if broken:
        f = broken[0]
        return _severe(ctx)(f"{f.path} line(s) {', '.join(map(str, f.bad_lines))} have no '=': "
                            "the runner stops with 'ValueError: not enough values to unpack'",
                            f"remove blank and comment lines from {f.path} (one NAME=value a line)",
                            *evidence)
    listed: dict[str, tuple[str, Path]] = {}
    for f in files:  # the runner reads ~ first, then the launch folder: the later one wins
        listed.update({k: (v.rstrip("\n"), f.path) for k, v in f.values.items()})
    needed = needed_variables(ctx)
    if not needed:
        return skip("no variable set here that the ranks on the other hosts would need "
                    "(HF_*, TORCH_*, an activated environment's PATH, ...): nothing to compare "
                    "with what the runner carries", *evidence)
    lost = sorted(n for n in needed if not n.startswith(rules.prefixes) and n not in listed)
    stale = sorted(n for n in needed if n in listed and listed[n][0] != needed[n])
    evidence += [f"{n}: here {show_variable(n, needed[n])}, in {listed[n][1]} "
                 f"{show_variable(n, listed[n][0])}" for n in stale]
    if lost:
        lines = " ".join(f'"{n}=${{{n}}}"' for n in lost)
        return mode_finding(warn, "launch.ds-env-not-forwarded",
                            f"{len(lost)} variable(s) set here will not reach the ranks on the "
                            f"other hosts: {', '.join(lost)} (pdsh starts them in a fresh ssh "
                            "login shell)", *evidence,
                            here=f"printf '%s\\n' {lines} >> {rules.env_file} in the launch folder")
    if stale:
        return warn(f"{rules.env_file} sets {', '.join(stale)} to another value than this "
                    "shell: every rank gets the file's value", "update or delete those lines in "
                    + ", ".join(sorted({str(listed[n][1]) for n in stale})), *evidence)
    return ok(f"every variable the job relies on reaches the other hosts ({len(needed)} checked)",
              *evidence)
