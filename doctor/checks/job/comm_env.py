"""comm: NCCL debugging variables left set (in the environment or NCCL's config files), and
the network NCCL_NET forces.

NCCL's documentation splits its variables in two: system configuration, to keep, and the
"Debugging" ones (P2P/SHM off, a forced network, algorithm or protocol), which "should not be
used in production nor retained in scripts ... Keeping them set may result in sub-optimal
behavior, crashes, or hangs" (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
A workaround copied from one machine to another is the usual way they survive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.fix import actions as fix_actions
from dsenv.doctor.registry import check
from dsenv.facts.comm import fabric
from dsenv.facts.comm.ncclconf import (
    Setting,
    looked_in,
    nccl_setting,
    nccl_settings,
    unanswered,
)
from dsenv.facts.gpu import modes as gpumodes
from dsenv.verdicts.findings import Finding, Status, fail, ok, skip, warn


def _on(value: str) -> bool:
    return value.strip() not in ("", "0")


@dataclass(frozen=True)
class DebugVariable:
    name: str
    applies: Callable[[str], bool]  # the value that makes it a debugging setting
    effect: str
    hurts: str = ""  # "nvlink" or "ib": the hardware it wastes when present


DEBUG_VARIABLES = (
    DebugVariable("NCCL_P2P_DISABLE", _on, "P2P transport off: GPU-to-GPU traffic goes "
                  "through host memory", "nvlink"),
    DebugVariable("NCCL_P2P_LEVEL", lambda v: v.strip().upper() in ("LOC", "0"),
                  "P2P never used (LOC)", "nvlink"),
    DebugVariable("NCCL_P2P_LEVEL", lambda v: v.strip().upper() not in ("", "LOC", "0"),
                  "P2P distance cutoff pinned"),
    DebugVariable("NCCL_SHM_DISABLE", _on, "shared-memory transport off: without P2P, "
                  "intra-node traffic goes over the network"),
    DebugVariable("NCCL_NET", lambda v: v.strip().lower() == "socket",
                  "network forced to TCP sockets", "ib"),
    DebugVariable("NCCL_ALGO", lambda v: bool(v.strip()), "collective algorithm pinned"),
    DebugVariable("NCCL_PROTO", lambda v: bool(v.strip()), "protocol pinned"),
)


@dataclass(frozen=True)
class Found:
    setting: Setting
    variable: DebugVariable

    def describe(self) -> str:
        return f"{self.setting.shown()}: {self.variable.effect}"


def debugging_settings(settings: dict[str, Setting]) -> list[Found]:
    found = []
    for variable in DEBUG_VARIABLES:
        setting = settings.get(variable.name)
        if setting is not None and variable.applies(setting.value):
            found.append(Found(setting, variable))
    return found


def removal(found: list[Found]) -> str:
    """One change that removes them all: `unset ...`, and the lines of each file."""
    in_env = [f.setting.name for f in found if f.setting.source == "environment"]
    files: dict[str, list[str]] = {}
    for f in found:
        if f.setting.source != "environment":
            files.setdefault(f.setting.source, []).append(f.setting.name)
    steps = [f"`unset {' '.join(in_env)}` (and drop them from the job script)"] if in_env else []
    steps += [f"delete the {', '.join(names)} line(s) from {path}" for path, names in files.items()]
    return "; ".join(steps)


@check("comm.nccl-env", "NCCL debugging variables left set")
def nccl_env(ctx: Context):
    found = debugging_settings(nccl_settings(ctx))
    hung = unanswered(ctx)
    if hung:
        return warn(f"NCCL's configuration file {hung[0]} gave no answer: its file system "
                    "stopped answering (a hung network mount?), and NCCL reads it in every rank "
                    "at init, so the job hangs there", "point NCCL_CONF_FILE at a file on a "
                    "node-local disk (or unset it), or wait for the file system to recover",
                    looked_in(ctx), *(f.describe() for f in found))
    if not found:
        return ok("no NCCL debugging variable set (environment, NCCL_CONF_FILE or ~/.nccl.conf, "
                  "/etc/nccl.conf)")
    evidence = [f.describe() for f in found]
    names = ", ".join(dict.fromkeys(f.setting.name for f in found))
    if any(f.variable.hurts == "nvlink" for f in found):
        links = gpumodes.nvlinks(ctx)
        if links:
            p2p = next(f for f in found if f.variable.hurts == "nvlink")
            return mode_finding(warn, "comm.p2p-disable-left-set",
                                f"{p2p.setting.name}={p2p.setting.value} on a node whose GPUs "
                                f"have NVLink ({links[0]} in `nvidia-smi topo -m`): intra-node "
                                "all-reduce runs at a fraction of the NVLink bandwidth",
                                *evidence, here=removal(found),
                                action=_reset(ctx, found, "nvlink"))
    if any(f.variable.hurts == "ib" for f in found):
        active = [p for p in fabric.ib_ports(ctx) if p.active]
        if active:
            return warn(f"NCCL_NET=Socket while {len(active)} InfiniBand/RoCE port(s) are "
                        "ACTIVE: NCCL uses TCP sockets, several times slower",
                        removal(found), *evidence, *[p.describe() for p in active],
                        action=_reset(ctx, found, "ib"))
    # A note, not a warning: nothing here says they cost anything on this node; the fix
    # still travels with it (the report carries it as data).
    return Finding(Status.INFO, f"NCCL debugging variable(s) set: {names}; NCCL's docs say "
                   "to remove them once the problem they worked around is solved",
                   tuple(evidence), removal(found))


def _reset(ctx: Context, found: list[Found], hurts: str):
    """`--fix`: back to NCCL's default for the settings that waste this node's hardware
    (only these: the others may be working around a real hang elsewhere)."""
    return fix_actions.nccl_reset(ctx, [(f.setting.name, f.setting.source) for f in found
                                        if f.variable.hurts == hurts])


# NCCL_NET names NCCL's internal transports "IB" and "Socket" (compared without case since
# NCCL 2.13) or a network plugin's network (aws-ofi-nccl: "AWS Libfabric", "OFI"; Google's
# "gIB"). A forced network that cannot open is fatal, with no fallback to sockets: NCCL's
# plugin/net.cc says "Failed to initialize any NET plugin" (2.27+), "Error: network %s not
# found." before.
@check("comm.nccl-net", "The network NCCL_NET forces opens on this node")
def nccl_net(ctx: Context):
    setting = nccl_setting(ctx, "NCCL_NET")
    if setting is None:
        return skip(f"NCCL_NET is not set ({looked_in(ctx)}): NCCL picks the network itself "
                    "and falls back to sockets")
    name = setting.value.strip()
    finding = fail if ctx.is_compute else warn
    unquoted = name.strip("'\"")
    if unquoted != name:
        return mode_finding(finding, "comm.net-forced-unavailable",
                            f"{setting.shown()}: the quotes are part of the value, so NCCL looks "
                            f"for a network named {name} that no transport or plugin has",
                            setting.where(), here=f"set it without quotes inside the value: "
                            f"{setting.name}={unquoted}")
    if name.lower() == "socket":
        return ok(f"{setting.shown()}: TCP sockets open on every node")
    if name.lower() == "ib":
        ports = fabric.ib_ports(ctx)
        active = [p for p in ports if p.active]  # NCCL's IB transport opens ACTIVE ports only
        if active:
            return ok(f"{setting.shown()}: {len(active)} ACTIVE InfiniBand/RoCE port(s)",
                      *[p.describe() for p in active])
        none = ("no ACTIVE InfiniBand/RoCE port" if ports else "no InfiniBand/RoCE device "
                "(/sys/class/infiniband is empty or absent)")
        return mode_finding(finding, "comm.net-forced-unavailable",
                            f"{setting.shown()} but this node has {none}: NCCL stops at init "
                            "instead of using sockets", setting.where(),
                            *[p.describe() for p in ports],
                            here=f"{setting.undo()} on nodes without InfiniBand; in a container, "
                            "pass /dev/infiniband in (--device /dev/infiniband)")
    plugin = fabric.find_net_plugin(ctx, rocm=None)
    names = " or ".join(fabric.net_plugin_names(ctx, rocm=None))
    if plugin:
        return ok(f"{setting.shown()}: a network plugin for it is on LD_LIBRARY_PATH ({plugin})")
    return mode_finding(finding, "comm.net-forced-unavailable",
                        f"{setting.shown()} names a network plugin's network, but no {names} "
                        "is on LD_LIBRARY_PATH: NCCL stops at init instead of using sockets",
                        setting.where(), f"LD_LIBRARY_PATH={ctx.env.get('LD_LIBRARY_PATH', '')}",
                        here="load the module that provides the plugin (e.g. aws-ofi-nccl) so its "
                        f"folder is on LD_LIBRARY_PATH, or {setting.undo()}")
