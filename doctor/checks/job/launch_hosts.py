"""launch, on every host: what a multi-node launch needs on the other hosts, asked of them.

The facts come from one survey (:mod:`..probes.remote_hosts`): over ssh where the launcher
itself uses ssh (DeepSpeed's pdsh runner; mpirun outside Slurm), otherwise one ``srun
--overlap`` step inside the allocation. A host that does not answer is named once, by
launch.hosts-answer; the other checks judge the hosts that answered and name the odd ones.
"""

from __future__ import annotations

import os
import re

from dsenv.doctor.catalogue import mode_finding, mode_id
from dsenv.doctor.checks.job.launch import multi_node
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.comm import fabric, netaddr
from dsenv.facts.comm.ncclconf import ENVIRONMENT, Setting, looked_in, nccl_setting
from dsenv.facts.launch import dsrunner, remote_hosts
from dsenv.facts.python import target_env
from dsenv.redact import show_variable
from dsenv.verdicts.findings import fail, ok, skip, warn

INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
SELECTING_VARIABLES = (*INTERFACE_VARIABLES, "NCCL_IB_HCA")
SHOWN_HOSTS = 6  # hosts named in a finding; the rest are counted


def _severe(ctx: Context):
    return fail if ctx.is_compute else warn


def _transport(ctx: Context) -> str:
    launcher = ctx.options.launcher
    if launcher == "deepspeed" or (launcher == "mpirun" and not ctx.env.get("SLURM_JOB_ID")):
        return "ssh"
    return "srun"


def ranks_python(ctx: Context) -> str:
    env = target_env.environment(ctx)
    return env.executable or env.python or ""


def _survey(ctx: Context) -> remote_hosts.Survey:
    hostfile_hosts = []
    if ctx.options.launcher in (None, "deepspeed"):
        hostfile_hosts = list(dsrunner.hostfile(ctx).hosts)
    names = [ctx.env["MASTER_ADDR"].strip()] if ctx.env.get("MASTER_ADDR", "").strip() else []
    paths = [p for p in (ranks_python(ctx), os.getcwd()) if p]
    return remote_hosts.survey(ctx, transport=_transport(ctx), hostfile_hosts=hostfile_hosts,
                               names=names, paths=paths)


def _applies(ctx: Context) -> tuple[remote_hosts.Survey | None, str]:
    multi, why = multi_node(ctx)
    if not multi:
        return None, f"one node ({why})"
    found = _survey(ctx)
    if not found.transport:
        return None, found.why
    return found, why


def _answered(ctx: Context) -> tuple[remote_hosts.Survey | None, str]:
    """The survey when at least one host answered; otherwise None and why (a check that
    judges the hosts' answers has nothing to judge: "all 0 hosts" would be a vacuous pass)."""
    found, why = _applies(ctx)
    if found is None:
        return None, why
    if not found.answered:
        return None, (f"none of the {len(found.hosts)} hosts answered over {found.transport}: "
                      "nothing to judge (launch.hosts-answer names them)")
    return found, why


def _named(hosts: list[str]) -> str:
    shown = ", ".join(hosts[:SHOWN_HOSTS])
    return shown + (f" and {len(hosts) - SHOWN_HOSTS} more" if len(hosts) > SHOWN_HOSTS else "")


def _how(found: remote_hosts.Survey) -> str:
    return (f"{len(found.hosts)} hosts from {found.why}, asked over {found.transport} in "
            f"{found.seconds:.1f} s")


def _ssh_mode(error: str) -> str:
    """The catalogue mode an ssh failure's message names (the host key, the key, sshd, or
    the host itself)."""
    if re.search(r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED", error):
        return mode_id("launch.ssh-host-key")
    if re.search(r"Permission denied", error):
        return mode_id("launch.ssh-publickey")
    if re.search(r"Connection refused", error):
        return mode_id("launch.sshd-refused")
    return mode_id("launch.host-unreachable")


@check("launch.hosts-answer", "Every host of the job answers (ssh or srun)")
def hosts_answer(ctx: Context):
    found, why = _applies(ctx)
    if found is None:
        return skip(why)
    evidence = [why, _how(found)] + [f"{h.host}: {h.error}" for h in found.silent]
    if found.silent:
        names = [h.host for h in found.silent]
        if found.transport == "ssh":
            return mode_finding(_severe(ctx), _ssh_mode(found.silent[0].error or ""),
                                f"no passwordless ssh to {_named(names)}: the launcher cannot "
                                "start ranks there (pdsh: `ssh exited with exit code 255`)",
                                *evidence, here="set up host keys and a passwordless key "
                                "between the nodes (`ssh -o BatchMode=yes HOST true` must "
                                "work), or launch with srun (`dsenv launch --launcher srun`)")
        return mode_finding(_severe(ctx), "launch.host-unreachable",
                            f"{_named(names)} did not answer an srun step: its ranks would not "
                            "start or would hang", *evidence, here="check the node (`scontrol "
                            f"show node {names[0]}`, its slurmd log) or drain it and resubmit")
    return ok(f"all {len(found.hosts)} hosts answered over {found.transport}", *evidence)


@check("launch.hosts-paths", "The ranks' interpreter and the launch folder on every host")
def hosts_paths(ctx: Context):
    found, why = _answered(ctx)
    if found is None:
        return skip(why)
    python, folder = ranks_python(ctx), os.getcwd()
    missing: dict[str, list[str]] = {}
    for host in found.answered:
        facts = host.paths
        if python and not facts.get(python, {}).get("exec"):
            missing.setdefault(f"interpreter {python}", []).append(host.host)
        if not facts.get(folder, {}).get("dir"):
            missing.setdefault(f"launch folder {folder}", []).append(host.host)
    evidence = [why, _how(found)]
    if missing:
        what, hosts = next(iter(missing.items()))
        evidence += [f"{w} missing on {_named(h)}" for w, h in missing.items()]
        return mode_finding(_severe(ctx), "launch.remote-paths-missing",
                            f"{what} does not exist on {_named(hosts)}: the ranks there fail "
                            "at once (`No such file or directory`)", *evidence,
                            here="put the environment and the launch folder on a file system "
                            "every node mounts (not /tmp or a node-local disk)")
    return ok(f"{python or 'the interpreter'} and {folder} exist on all "
              f"{len(found.answered)} hosts", *evidence)


def _setting(ctx: Context, name: str) -> Setting | None:
    """The value the job's library will use: NCCL's from its environment or configuration
    files (judged with the files as this host reads them), gloo's from the environment."""
    if name.startswith("NCCL_"):
        return nccl_setting(ctx, name)
    value = ctx.env.get(name, "").strip()
    return Setting(name, value, ENVIRONMENT) if value else None


def _selected_interfaces(ctx: Context, host: remote_hosts.HostFacts) -> list[str] | None:
    """The interfaces the ranks' sockets may use on HOST (None: no variable restricts them)."""
    gloo = _setting(ctx, "GLOO_SOCKET_IFNAME")
    if gloo:  # gloo: exact names, comma-separated
        return [n for n in gloo.value.split(",") if n in host.interfaces]
    nccl = _setting(ctx, "NCCL_SOCKET_IFNAME")
    if nccl:
        return fabric.parse_nccl_list(nccl.value).selected(list(host.interfaces))
    return None


@check("launch.hosts-master", "MASTER_ADDR from every host")
def hosts_master(ctx: Context):
    value = ctx.env.get("MASTER_ADDR", "").strip()
    found, why = _answered(ctx)
    if found is None:
        return skip(why)
    if not value:
        return skip("MASTER_ADDR is not set (launch.master-addr says what that means)")
    shown = show_variable("MASTER_ADDR", value)
    unresolved, loopback, other_route, answers = [], [], [], {}
    for host in found.answered:
        seen = host.resolved.get(value, {})
        if "error" in seen or not seen:
            unresolved.append(host.host)
            continue
        answers[host.host] = seen
        if all(netaddr.is_loopback(a) for a in seen["addresses"]):
            loopback.append(host.host)
            continue
        allowed = _selected_interfaces(ctx, host)
        if allowed is not None and seen["interface"] not in allowed:
            other_route.append(host.host)
    evidence = [why, _how(found)] + [f"{h}: {value} -> {', '.join(a['addresses'])} via "
                                     f"{a['interface']}" for h, a in list(answers.items())[:8]]
    if unresolved:
        return mode_finding(_severe(ctx), "launch.master-addr-other-hosts",
                            f"{shown} does not resolve on {_named(unresolved)}: the ranks there "
                            "cannot find the rendezvous", *evidence, here="use a name every "
                            "node resolves (the first node as `scontrol show hostnames` prints "
                            "it) or its address")
    if loopback:
        return mode_finding(_severe(ctx), "launch.store-unreachable",
                            f"{shown} is loopback on {_named(loopback)}: those hosts meet "
                            "themselves and wait for ranks that never come", *evidence,
                            here="set MASTER_ADDR to the first node's fabric address or name")
    distinct = {tuple(a["addresses"]) for a in answers.values()}
    if len(distinct) > 1:
        return mode_finding(_severe(ctx), "launch.master-addr-other-hosts",
                            f"{shown} resolves to different addresses on different hosts "
                            f"({'; '.join(', '.join(d) for d in sorted(distinct))})", *evidence,
                            here="use the first node's address rather than a name with per-host "
                            "/etc/hosts entries")
    if other_route:
        chosen = _setting(ctx, "GLOO_SOCKET_IFNAME") or _setting(ctx, "NCCL_SOCKET_IFNAME")
        return mode_finding(warn, "launch.rdzv-wrong-interface",
                            f"{_named(other_route)} reach {shown} through an interface that "
                            f"{chosen.shown()} does not select: the rendezvous and the ranks' "
                            "sockets take different networks (a firewall between them hangs "
                            "the job)", *evidence, here=f"use the first node's address on the "
                            f"{chosen.name} interface as MASTER_ADDR")
    return ok(f"{shown} resolves to {', '.join(next(iter(distinct)))} on all "
              f"{len(answers)} hosts", *evidence)


def _interface_problems(ctx: Context, host: remote_hosts.HostFacts) -> list[str]:
    problems = []
    for name in INTERFACE_VARIABLES:
        setting = _setting(ctx, name)
        if setting is None:
            continue
        value, shown = setting.value, setting.shown()
        if name == "GLOO_SOCKET_IFNAME":
            absent = [n for n in value.split(",") if n not in host.interfaces]
            down = [n for n in value.split(",") if host.interfaces.get(n, {}).get("state")
                    == "down"]
        else:
            spec = fabric.parse_nccl_list(value)
            chosen = spec.selected(list(host.interfaces))
            absent = [] if chosen else [value]
            down = [n for n in chosen if host.interfaces[n].get("state") == "down"]
            if chosen and len(down) < len(chosen):
                down = []
        problems += [f"{shown}: no interface {n}" for n in absent]
        problems += [f"{shown}: {n} is down" for n in down]
    hca = _setting(ctx, "NCCL_IB_HCA")
    if hca:
        spec = fabric.parse_nccl_list(hca.value)
        if not spec.exclude and not spec.selected(host.hcas):
            problems.append(f"{hca.shown()}: no such HCA (has "
                            f"{', '.join(host.hcas) or 'none'})")
    return problems


@check("launch.hosts-ifname", "Interface and HCA variables valid on every host")
def hosts_ifname(ctx: Context):
    set_here = [s for s in map(lambda n: _setting(ctx, n), SELECTING_VARIABLES) if s]
    if not set_here:
        return skip("NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA not set",
                    looked_in(ctx))
    found, why = _answered(ctx)
    if found is None:
        return skip(why)
    bad = {h.host: _interface_problems(ctx, h) for h in found.answered}
    bad = {h: p for h, p in bad.items() if p}
    evidence = [why, _how(found)] + [f"{h}: {'; '.join(p)}" for h, p in list(bad.items())[:8]]
    if bad:
        first = next(iter(bad.values()))[0]
        return _severe(ctx)(f"{first} on {_named(list(bad))}: the ranks there fail to create "
                            "their sockets or pick no network (gloo: 'Unable to find address "
                            "for ...'; NCCL: 'no socket interface found')", "name interfaces "
                            "every node has (`ip -br link` on each), or a prefix such as "
                            "NCCL_SOCKET_IFNAME=hsn that matches hsn0 and hsn1", *evidence)
    evidence += [s.where() for s in set_here if s.from_file]
    interfaces = ", ".join(s.shown() for s in set_here)
    return ok(f"{interfaces} valid on all {len(found.answered)} hosts", *evidence)
