"""comm: NCCL/RCCL version and the fabric it will use (InfiniBand, RoCE, Slingshot, sockets)."""

from __future__ import annotations

from dataclasses import replace

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.checks.job.launch import multi_node
from dsenv.doctor.context import Context
from dsenv.doctor.fix import actions as fix_actions
from dsenv.doctor.registry import check
from dsenv.facts.comm import fabric, interfaces
from dsenv.facts.comm.ncclconf import Setting, looked_in, nccl_setting
from dsenv.facts.python import torch_info
from dsenv.redact import show_variable
from dsenv.verdicts.findings import fail, info, ok, skip, warn


def _finding(ctx: Context):
    """fail on a compute target, warn on a login node (the compute nodes may differ)."""
    return fail if ctx.is_compute else warn


@check("comm.nccl", "NCCL/RCCL version")
def nccl(ctx: Context):
    build = torch_info.torch_build(ctx)
    if not build.installed:
        return skip(torch_info.NOT_INSTALLED)
    if build.kind == "cpu":
        return skip(f"CPU torch: gloo is used ({build.describe()})")
    lib = fabric.comm_library(ctx)
    if lib is None or lib.version is None:
        name = "RCCL" if build.kind == "hip" else "NCCL"
        evidence = [build.describe()] + ([f"found without a version: {lib.source}"] if lib else [])
        if not ctx.is_compute:
            return info(f"{name} version not found (torch may link it statically)", *evidence)
        fix = ("load the ROCm module that provides librccl.so (`module load rocm`)"
               if build.kind == "hip" else
               f"`pip install nvidia-nccl-cu{(build.cuda or '12').split('.')[0]}`")
        return warn(f"{name} not found for {build.describe()}", fix, *evidence)
    copies = fabric.nccl_copies(ctx)
    if len(copies) > 1:  # the first on the loader's path may not be the one torch was built with
        return mode_finding(warn, "comm.multiple-nccl",
                            f"{len(copies)} NCCL versions reachable: "
                            + ", ".join(c.version or "?" for c in copies)
                            + ": torch may load one it was not built against",
                            *(f"NCCL {c.version}: {c.source}" for c in copies), build.describe())
    return ok(f"{lib.name} {lib.version} ({lib.source})", build.describe())


@check("comm.infiniband", "InfiniBand / RoCE ports")
def infiniband(ctx: Context):
    ports = fabric.ib_ports(ctx)
    if not ports:
        return skip("no RDMA devices under /sys/class/infiniband")
    evidence = [p.describe() for p in ports]
    verbs = fabric.ibverbs_error(ctx)
    if verbs:  # the ports are there, the library NCCL opens to use them is not
        return mode_finding(fail if ctx.is_compute else warn, "comm.ibverbs-unloadable",
                            f"{len(ports)} RDMA port(s), but libibverbs.so.1 cannot be loaded: "
                            "NCCL quietly falls back to TCP sockets", *evidence, verbs)
    active = [p for p in ports if p.active]
    if not active:
        summary = f"{len(ports)} RDMA port(s), none ACTIVE: NCCL falls back to TCP sockets"
        if ctx.is_compute:
            return warn(summary, "check the cable/subnet manager with `ibstat`, or exclude the "
                        "ports with NCCL_IB_HCA and tell the admins", *evidence)
        return info(summary, *evidence)
    kinds = sorted({"RoCE" if p.roce else p.link_layer for p in active})
    return ok(f"{len(active)} of {len(ports)} RDMA port(s) ACTIVE ({', '.join(kinds)})", *evidence)


@check("comm.roce-gid", "RoCE GID index")
def roce_gid(ctx: Context):
    roce = [p for p in fabric.ib_ports(ctx) if p.roce]
    if not roce:
        return skip("no RoCE ports")
    ports = [p for p in roce if p.active] or roce
    port = ports[0]
    table = fabric.gid_table(ctx, port)
    best = fabric.pick_roce_gid(table)
    evidence = [f"{port.name} GID[{g.index}] {g.gid} {g.kind or '?'}"
                + (f" ({g.ipv4})" if g.ipv4 else "") for g in table]
    setting = nccl_setting(ctx, "NCCL_IB_GID_INDEX")
    if setting is None:
        evidence.append(looked_in(ctx))
        if best is None:
            return mode_finding(warn, "comm.roce-gid-index",
                                f"RoCE port {port.name} without NCCL_IB_GID_INDEX and no RoCE "
                                "v2 GID with an IPv4 address", *evidence,
                                here="configure an IPv4 address on the RoCE interface, then set "
                                "NCCL_IB_GID_INDEX to its RoCE v2 GID index")
        return mode_finding(warn, "comm.roce-gid-index",
                            f"RoCE port {port.name} without NCCL_IB_GID_INDEX: NCCL may pick a "
                            "link-local GID and time out (ibv_modify_qp / completion error 12)",
                            f"GID[{best.index}] is RoCE v2 with IPv4 {best.ipv4}", *evidence,
                            here=f"export NCCL_IB_GID_INDEX={best.index}",
                            action=fix_actions.activate_exports(
                                ctx, fix_actions.NCCL, {"NCCL_IB_GID_INDEX": str(best.index)}))
    chosen = setting.value
    if setting.from_file:
        evidence.insert(0, setting.where())
    entry = next((g for g in table if str(g.index) == chosen), None)
    if table and (entry is None or "v2" not in entry.kind.lower()):
        what = "does not exist" if entry is None else f"is {entry.kind or 'unreadable'}"
        fix = (f"export NCCL_IB_GID_INDEX={best.index}" if best else setting.undo()) + (
            f" (it overrides the line in {setting.source})" if best and setting.from_file
            else "")
        return mode_finding(warn, "comm.roce-gid-index", f"{setting.shown()} on {port.name} "
                            f"{what}", *evidence, here=fix)
    return ok(setting.shown() + (f" ({entry.kind}, {entry.ipv4 or entry.gid})"
                                 if entry else ""), *evidence)


@check("comm.slingshot", "Slingshot OFI plugin")
def slingshot(ctx: Context):
    devices = fabric.cxi_devices(ctx)
    if not devices:
        return skip("no Slingshot (cxi) devices under /sys/class/cxi")
    build = torch_info.torch_build(ctx)
    rocm = {"hip": True, "cuda": False}.get(build.kind)
    plugin = fabric.find_net_plugin(ctx, rocm)
    evidence = ["cxi devices: " + ", ".join(devices)]
    if plugin:
        evidence.append(show_variable("FI_PROVIDER", ctx.env.get("FI_PROVIDER", "(unset)")))
        return ok(f"OFI network plugin found: {plugin}", *evidence)
    names = fabric.net_plugin_names(ctx, rocm)
    evidence.append("looked for " + ", ".join(names) + " on LD_LIBRARY_PATH")
    module = "aws-ofi-rccl" if rocm else "aws-ofi-nccl"
    return mode_finding(
        _finding(ctx), "comm.slingshot-no-ofi-plugin",
        f"Slingshot ({len(devices)} cxi device(s)) without the OFI plugin: NCCL/RCCL falls back "
        "to TCP sockets", *evidence, here=f"`module load {module}` (it puts the plugin on "
        "LD_LIBRARY_PATH) and `export FI_PROVIDER=cxi`")


@check("comm.slingshot-vni", "Slingshot network service (VNI) for the ranks")
def slingshot_vni(ctx: Context):
    """Slurm's HPE Slingshot plugin grants each srun step a VNI; ranks another launcher starts
    (torchrun, DeepSpeed's runner over ssh, mpirun's own daemons) have none, and libfabric's
    cxi provider then fails at fi_domain (ENOSYS) unless the site keeps its default service
    open (uiuc-hpc/lci#110, open-mpi/ompi#12038)."""
    devices = fabric.cxi_devices(ctx)
    if not devices:
        return skip("no Slingshot (cxi) devices under /sys/class/cxi")
    launcher = ctx.job.launcher
    if launcher is None:
        return skip("the launcher is not known: give --launcher to judge how ranks get a VNI")
    evidence = ["cxi devices: " + ", ".join(devices), f"--launcher {launcher}"]
    if launcher == "srun":
        return ok("srun starts the ranks: each step gets its VNI from Slurm (one node: add "
                  "--network=single_node_vni where the site asks for it)", *evidence)
    return mode_finding(warn, "comm.slingshot-no-vni",
                        f"{launcher} starts the ranks on Slingshot: they get no network service "
                        "(VNI) from Slurm, and the cxi provider fails at fi_domain unless the "
                        "site keeps its default service open", *evidence,
                        here="`dsenv launch --launcher srun` (srun starts every rank)")


def _interface_list_check(ctx: Context, setting: Setting, names: list[str], what: str):
    variable = setting.name
    spec = fabric.parse_nccl_list(setting.value)
    shown = setting.shown()
    available = f"{what} here: " + (", ".join(names) or "none")
    missing = spec.unmatched(names)
    selected = spec.selected(names)
    where = (setting.where(),) if setting.from_file else ()
    if not selected:
        undo = f"delete its line from {setting.source}" if setting.from_file else "unset it"
        return _finding(ctx)(f"{shown} selects no {what} on this node", f"set {variable} to "
                             f"one of: {', '.join(names) or '(none)'} (or {undo})", available,
                             *where)
    if missing and not spec.exclude:
        place = f"{variable} in {setting.source}" if setting.from_file else variable
        return warn(f"{shown}: {', '.join(missing)} match(es) no {what}", f"drop "
                    f"{', '.join(missing)} from {place}", available,
                    "selected: " + ", ".join(selected), *where)
    return ok(f"{shown} selects {', '.join(selected)}", available, *where)


@check("comm.socket-ifname", "NCCL_SOCKET_IFNAME")
def socket_ifname(ctx: Context):
    setting = nccl_setting(ctx, "NCCL_SOCKET_IFNAME")
    if setting is None:
        return skip("NCCL_SOCKET_IFNAME is not set (NCCL prefers ib*, then any but lo/docker)",
                    looked_in(ctx))
    names = fabric.net_interfaces(ctx)
    finding = _interface_list_check(ctx, setting, names, "network interface")
    if finding.status.failing or finding.status.value == "warn":
        finding = mode_finding(fail if finding.status.failing else warn,
                               "comm.socket-ifname-missing", finding.summary, *finding.evidence,
                               here=finding.fix)
    if not fabric.parse_nccl_list(setting.value).selected(names):  # back to NCCL's own choice
        action = fix_actions.nccl_reset(ctx, [(setting.name, setting.source)])
        return replace(finding, action=action)
    return finding


@check("comm.bootstrap-interface", "Interface NCCL picks by itself")
def bootstrap_interface(ctx: Context):
    if nccl_setting(ctx, "NCCL_SOCKET_IFNAME") is not None:
        return skip("NCCL_SOCKET_IFNAME chooses the interface (comm.socket-ifname judges it)")
    read = interfaces.read(ctx)
    if read.found is None:
        return skip(f"the node's interfaces could not be read: {read.why}")
    chosen, step = interfaces.nccl_choice(read.found)
    listed = [i.describe() for i in read.found] or ["(none)"]
    if not chosen:
        return skip("no interface has an IP address: nothing for NCCL to choose from",
                    *listed)
    multi, why = multi_node(ctx)
    picked = ", ".join(i.name for i in chosen)
    summary = f"NCCL_SOCKET_IFNAME unset: NCCL picks {picked} ({step})"
    evidence = [f"interfaces ({read.why}): " + "; ".join(listed), f"nodes: {why}"]
    comm_id = nccl_setting(ctx, "NCCL_COMM_ID")
    if comm_id is not None:
        evidence.append(f"NCCL_COMM_ID is set ({comm_id.source}): an interface in its subnet is "
                        "tried before these")
    if multi and all(i.name.startswith(("lo", "docker")) for i in chosen):
        # ranks on other nodes connect to the address rank 0 advertises: lo's and a Docker
        # bridge's are this node's own
        return mode_finding(_finding(ctx), "comm.no-bootstrap-interface",
                            f"{summary}, which ranks on other nodes cannot reach", *evidence,
                            here="export NCCL_SOCKET_IFNAME=<the interface that carries the "
                                 "nodes' addresses>, or run the containers with the hosts' "
                                 "network (--network=host)")
    if not multi and all(i.name.startswith("lo") for i in chosen):
        return ok(f"{summary}: enough for one node's ranks", *evidence)
    return ok(summary, *evidence)


@check("comm.gloo-ifname", "GLOO_SOCKET_IFNAME")
def gloo_ifname(ctx: Context):
    # Gloo reads only the environment, and takes a comma-separated list of exact interface
    # names (gloo/transport/tcp/device.cc: getifaddrs per name): no prefix, ^ or = as NCCL has
    value = ctx.env.get("GLOO_SOCKET_IFNAME")
    if not value:
        return skip("GLOO_SOCKET_IFNAME is not set (Gloo uses the address of the host name)")
    names = fabric.net_interfaces(ctx)
    if not names:
        return skip("no network interface is listed here (/sys/class/net): nothing to compare "
                    f"GLOO_SOCKET_IFNAME={value} with")
    shown = show_variable("GLOO_SOCKET_IFNAME", value)
    missing = [name for name in value.split(",") if name not in names]
    if not missing:
        return ok(f"{shown}: every name is an interface of this node")
    syntax = [name for name in missing if name[:1] in "^="]
    why = (" (NCCL's ^/= syntax: Gloo takes exact names)" if syntax else
           " (Gloo takes exact names, no prefixes or addresses)")
    return mode_finding(fail if ctx.is_compute else warn, "comm.gloo-ifname-invalid",
                        f"{shown}: {', '.join(missing)} is not an interface of this node{why}; "
                        "the gloo group aborts with \"Unable to find address for\"",
                        "interfaces here: " + ", ".join(names))


@check("comm.ib-hca", "NCCL_IB_HCA")
def ib_hca(ctx: Context):
    setting = nccl_setting(ctx, "NCCL_IB_HCA")
    if setting is None:
        return skip("NCCL_IB_HCA is not set (NCCL uses every active HCA)", looked_in(ctx))
    ports = fabric.ib_ports(ctx)
    devices = sorted({p.device for p in ports})
    finding = _interface_list_check(ctx, setting, devices, "HCA")
    if finding.status.value != "ok":
        return finding
    spec = fabric.parse_nccl_list(setting.value)
    bad_ports = [f"{name}:{port}" for name, port in spec.items if port is not None
                 and not any(spec.matches(name, p.device) and p.port == port for p in ports)]
    if bad_ports and not spec.exclude:
        return _finding(ctx)(f"{setting.shown()} names port(s) that do not exist: "
                             f"{', '.join(bad_ports)}", "use ports listed by `ibstat` "
                             "(usually :1)", *[p.describe() for p in ports],
                             *((setting.where(),) if setting.from_file else ()))
    return finding


@check("comm.ib-disable", "NCCL_IB_DISABLE")
def ib_disable(ctx: Context):
    setting = nccl_setting(ctx, "NCCL_IB_DISABLE")
    if setting is None:
        return skip("NCCL_IB_DISABLE is not set", looked_in(ctx))
    if setting.value == "0":
        return skip(f"{setting.shown()}: InfiniBand stays on (NCCL's default)", setting.where())
    where = (setting.where(),) if setting.from_file else ()
    active = [p for p in fabric.ib_ports(ctx) if p.active]
    if not active:
        return ok(f"{setting.shown()} and no ACTIVE InfiniBand/RoCE port here", *where)
    fix = (f"export NCCL_IB_DISABLE=0 (it overrides the line in {setting.source}), or "
           f"delete that line" if setting.from_file else "unset NCCL_IB_DISABLE")
    return mode_finding(warn, "comm.ib-disable-left-set",
                        f"{setting.shown()} while {len(active)} InfiniBand/RoCE port(s) are "
                        "ACTIVE: NCCL will use TCP sockets, several times slower",
                        *[p.describe() for p in active], *where, here=fix,
                        action=fix_actions.nccl_reset(ctx, [(setting.name, setting.source)]))
