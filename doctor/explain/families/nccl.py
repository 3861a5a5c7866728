"""NCCL/RCCL messages read by structure.

NCCL prints ``host:pid:tid [dev] file.cc:LINE NCCL WARN <text>`` (older releases: ``WARN``
alone, ``include/socket.h``, ``.cu`` files), torch wraps its result codes as
``ncclSystemError``/``ncclInternalError``/``ncclInvalidUsage``/``ncclUnhandledCudaError``
followed by ``Last error:`` and NCCL's last WARN text. The parts read here: the source file
that warned (which transport: socket, bootstrap, net_ib, ibvwrap, shm, p2p, nvls, the
plugin loader), the call that failed (ibv_*, cuMulticast*, posix_fallocate) with its errno
text, and the names NCCL or libibverbs quote (interfaces, providers, plugins). Small rules
map them to catalogue modes, so a new NCCL version's wording of the same failure is still
understood.

Gloo, torch's other backend, fails on the same interface choice in its own words
(``[enforce fail at .../gloo/transport/tcp/device.cc:N] ifa != nullptr. Unable to find address
for: NAME``): the NAME it looked up is read here too.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading
from dsenv.doctor.explain.families.container import docker_host

FAMILY = "nccl"

# host:pid:tid [dev] src/file.cc:123 NCCL WARN text   (also "WARN" without NCCL, .cu, ib_plugin.c;
# plugins print a function: "get_ofi_provider:312 NCCL WARN")
_WARN = re.compile(r"(?P<file>[\w./-]+\.(?:cc|cu|c|h)|[a-z]\w*):(?P<line>\d+) (?:NCCL |RCCL )?WARN "
                   r"(?P<text>.*)")
_RESULT = re.compile(r"\bnccl(?P<kind>System|Internal|Remote|InvalidUsage|InvalidArgument|UnhandledCuda)"
                     r"Error\b")
_LAST = re.compile(r"Last (?:NCCL warning\(error\)|error):\s*'?(?P<text>[^\n']+)")
# the ibverbs call NCCL wraps (misc/ibvwrap.cc): "Call to ibv_reg_mr_iova2 failed with error X"
_IBV_CALL = re.compile(r"(?:Call to )?(?P<call>ibv_\w+)(?:\([^)]*\))? failed(?: with (?:error )?"
                       r"(?P<errno>[A-Za-z][\w ]+|\d+ [A-Za-z][\w ]+))?")
_COMPLETION = re.compile(r"Got completion (?:from peer \S+ )?with (?:error |status=)(?P<status>\d+)")
_PROVIDER = re.compile(r"libibverbs: Warning: couldn't load driver '(?P<provider>[^']+)': "
                       r"(?P<why>[^\n]*)")
_SOCKET_LIST = re.compile(r"NET/Socket : Using(?:\s+\[\d+\][\w.-]+:\S*)+")
_IFACE = re.compile(r"\[\d+\]([\w.-]+):")
_VIRTUAL = ("veth", "br-", "virbr", "docker", "cni", "flannel", "cali")
# gloo's device.cc: `ifa` is the interface lookup of GLOO_SOCKET_IFNAME, `rp` the lookup of the
# host's own name (another cause: a hostname that does not resolve); torch >= 2 may print the
# message alone.
_GLOO_IFACE = re.compile(r"(?:\b(?P<expr>ifa|rp) != nullptr\.\s+)?Unable to find address for: "
                         r"(?P<value>[^\s'\"]+)")
_ADDRESS = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|\[?[0-9a-f]*:[0-9a-f:]+\]?)$", re.I)
# The GIDs NCCL names since 2.2x, on a failed QP transition ("local GID index 3, local GID
# ::ffff:10.1.1.2, remote GID ...") or a failed completion ("localGid fe80::1 remoteGids ...").
_GID = re.compile(r"(?:local GID index (?P<index>\d+), )?local ?GID (?P<local>[0-9a-f:.]+[0-9a-f])"
                  r",? remote ?GIDs? ?(?P<remote>[0-9a-f:.]+[0-9a-f])", re.I)
# Gloo's TCP pair connecting to a loopback address its peer advertised: the peer's host name
# resolved to 127.x (Debian's /etc/hosts, a container on the host network).
_GLOO_LOOPBACK = re.compile(r"pair\.cc:\d+\] (?:connect \[(?P<addr>127(?:\.\d{1,3}){3})\]:(?P<port>\d+)"
                            r": Connection refused|timed out connecting: [^\n]*?remote=\[(?P<addr2>"
                            r"127(?:\.\d{1,3}){3})\]:(?P<port2>\d+))")
_PLUGIN = re.compile(r"NET/Plugin ?: (?:Plugin load \((?P<lib>libnccl-net[\w.-]*)\) returned \d+|"
                     r"No plugin found|Could not find: (?P<lib2>libnccl-net[\w.-]*))"
                     r"|Unable to load (?P<lib3>libnccl-net[\w.-]*)")


# misc/shmutils.cc: "Error while creating|attaching to shared memory segment PATH (size N),
# error: <strerror> (<errno>)"
_SHM_SEGMENT = re.compile(r"(?P<op>creating|attaching to) shared memory segment (?P<path>\S*)\s*"
                          r"\(size (?P<size>\d+)\)(?:, error: (?P<why>[^(\n]+?) \((?P<errno>\d+)\))?")


_CUSTOM_ALLREDUCE = re.compile(r"custom_all_reduce|CustomAll[Rr]educe|\[TensorRT-LLM\]")


def _shm_cause(text: str, m: re.Match | None) -> str:
    """The cause of a failed shared-memory segment (``m``: its _SHM_SEGMENT match) from the
    errno NCCL printed with it: ENOSPC
    (or posix_fallocate, "failed to extend") is /dev/shm full (a container's 64 MB default);
    EACCES, EPERM or EROFS is /dev/shm's mode or a read-only mount; an attach of a zero-sized
    segment whose name is not a /dev/shm name is the peer's cuMem handle read as a path (one
    rank fell back from cuMem host memory, NVIDIA/nccl#2190); any other errno names none."""
    if m is None or m["errno"] is None:  # before 2.12: the call and its errno on their own line
        return ("system.shm-too-small" if re.search(
            r"No space left on device|posix_fallocate|failed to extend|creating shared memory",
            text) else "")
    if m["errno"] == "28":
        return "system.shm-too-small"
    if m["errno"] in ("1", "13", "30"):
        return "system.shm-not-writable"
    if m["op"] == "attaching to" and m["size"] == "0" and m["errno"] == "2":
        return "comm.cumem-host-numa-divergent"
    return ""


_NO_IB_DEVICE = re.compile(r"NET/IB ?: No device found")
_IB_LIST_FAILED = re.compile(r"Failed to get IB devices list(?:: [^\n]*)?")
_IB_WANTED = re.compile(r"NCCL_IB_HCA set to \S+|NCCL_NET\W{0,4}(?:set by environment to )?\W?IB\b"
                        r"|\bibv_devinfo\b|\bibstatus\b")
_IB_OPEN_FAILED = re.compile(r"Unable to open device|Call to ibv_open_device failed")


def _gid_parts(text: str) -> dict[str, str]:
    """The GID index and GIDs NCCL names, with what kind of address the local GID is."""
    m = _GID.search(text)
    if not m:
        return {}
    local = m["local"].lower()
    kind = ("link-local (fe80::), not routed between subnets" if local.startswith("fe80:") else
            "IPv4-mapped (RoCE v2 over IPv4)" if local.startswith("::ffff:") else "")
    return {"gid_index": m["index"] or "", "local_gid": m["local"], "remote_gid": m["remote"],
            "gid_kind": kind}


def _warn_parts(message: str) -> list[tuple[str, str]]:
    """(source file, warning text) for every WARN line, plus torch's "Last error:" text."""
    found = [(m["file"], m["text"].strip()) for m in _WARN.finditer(message)]
    found += [("", m["text"].strip()) for m in _LAST.finditer(message)]
    return found or [("", message)]


def read(message: str, around: str = "") -> list[Reading]:
    if not message.strip():
        return []
    out: list[Reading] = []
    kind = (m := _RESULT.search(message)) and m["kind"] or ""

    def add(mode: str, text: str, **parts: str) -> None:
        out.append(reading(FAMILY, mode, text, result=kind, **parts))

    # An IB port error or HCA fault explains the completion timeouts that follow it.
    link_fault = re.search(r"Got async event : (?:port error|local catastrophic error|device fatal"
                           r" error)", message)
    if link_fault:
        add("comm.ib-link-errors", link_fault.group(0), call="IB async event")
    # A bus error inside NCCL (its frames in the backtrace): a page of NCCL's shared-memory
    # segment that /dev/shm cannot back (tmpfs full, Docker's 64 MB default).
    if re.search(r"Caught signal 7\b|\bSIGBUS\b|\bBus error\b", message) and (
            frame := re.search(r"\b(nccl[A-Z]\w*)\(|libnccl\.so", message)):
        add("system.shm-too-small", frame.group(0), call="bus error in NCCL's shared memory",
            frame=frame.group(1) or "libnccl.so")
    for source, text in _warn_parts(message):
        base = source.rsplit("/", 1)[-1]
        # NCCL's shared-memory segment (shm.cc / shmutils.cc): since 2.12 the line ends in the
        # errno of the call that failed, which says why (_shm_cause).
        if (base.startswith(("shm", "shmutils")) or "/dev/shm/nccl" in text) and re.search(
                r"No space left on device|posix_fallocate|failed to extend|(?:creating|attaching"
                r" to) shared memory segment", text):
            segment = _SHM_SEGMENT.search(text)
            if mode := _shm_cause(text, segment):
                add(mode, text, file=source, call="shared-memory segment",
                    errno=f"{segment['why']} ({segment['errno']})" if segment and segment["errno"]
                    else "")
        # NVLS multicast (nvls.cc, cuMulticast*) fails when the Fabric Manager is unhealthy.
        elif base.startswith("nvls") or "NVLink SHARP (NVLS)" in text:
            add("comm.nvls-fabric-manager", text, file=source, call="NVLS multicast")
        # CUDA error 217: the two GPUs have no peer access (p2p.cc IPC, shm.cc cuMem host, or
        # an inference engine's own all-reduce, which no NCCL setting helps: sglang#552)
        elif re.search(r"peer access is not supported|IPC handle : 217|failure 217", text):
            own = _CUSTOM_ALLREDUCE.search(f"{source} {text}")
            add("comm.p2p-peer-access-unsupported", text, file=source, call="CUDA peer access",
                caller=own.group(0) if own else "")
        # accelerate refuses consumer cards without P2P (RTX 3090/4000 series) until NCCL's
        # P2P and IB transports are turned off for them.
        elif m := re.search(r"Using (RTX [\w ]+?) series doesn't support faster communication "
                            r"broadband via P2P", text):
            add("comm.p2p-peer-access-unsupported", m.group(0), call="accelerate's P2P check",
                gpus=m[1])
        # A driver API the node's driver lacks: NCCL was built for a newer CUDA than the driver.
        elif re.search(r"Cuda failure .*API call is not supported in the installed CUDA driver",
                       text):
            add("comm.nccl-newer-than-driver", text, file=source, call="CUDA driver API")
        # Bootstrap without an interface: socket creation/bind with no address family or
        # no interface in the peers' subnet.
        elif re.search(r"Address family not supported|No usable listening interface|No interface "
                       r"found in the same subnet", text):
            # A container (Docker names its host after the container id) that cannot even
            # create a socket has no network at all: container.py names that; a subnet
            # mismatch stays this mode (NCCL names the address it was asked to reach).
            # c10d's own "[c10d] The IPv6 network addresses of (host, port) cannot be
            # retrieved (... errno: 97 ...)" is a notice: torch goes on with IPv4 (vidur#49,
            # codellama#215); only NCCL's WARN line (or torch's "Last error:") is the failure.
            c10d_notice = text == message and "c10d" in message
            if not ("Address family not supported" in text and docker_host(message)) \
                    and not c10d_notice:
                add("comm.no-bootstrap-interface", text, file=source, call="bootstrap socket")
        # An interface name NCCL_SOCKET_IFNAME asked for matched nothing: "no socket interface
        # found", or a garbage address family from an empty interface list.
        elif re.search(r"no (?:NCCL_SOCKET_IFNAME )?socket interface found|neither AF_INET\(2\) "
                       r"nor AF_INET6", text):
            add("comm.socket-ifname-missing", text, file=source, call="interface selection")
        # Completion error 12 (IBV_WC_RETRY_EXC_ERR) or ibv_modify_qp timing out: the RoCE
        # peers never hear each other, the GID choice being the usual reason.
        elif (c := _COMPLETION.search(text)) and c["status"] == "12":
            if not link_fault:
                add("comm.roce-gid-index", text, file=source, call="completion", status="12",
                    **_gid_parts(text))
        # NCCL_NET names a network no loaded plugin provides: the OFI plugin is missing (Slingshot).
        elif m := re.search(r"Error: network (AWS Libfabric|OFI) not found", text):
            add("comm.slingshot-no-ofi-plugin", text, file=source, network=m[1])
        # The AWS OFI plugin found no efa provider: no EFA device on this node or container
        # (older plugins: "Could not find any optimal provider", nccl#229).
        elif re.search(r"NET/OFI (?:Only EFA provider is supported|(?:Could not|Couldn't) find "
                       r"any optimal provider)", text):
            add("comm.efa-unavailable", text, file=source, plugin="aws-ofi-nccl")
        # The tuner found no algorithm/protocol pair (enqueue.cc). Old NCCL says only that, and
        # there NCCL_ALGO/NCCL_PROTO are the usual reason; newer NCCL names the function and
        # appends "NCCL_ALGO was set to ..." when they were forced: without it (nothing forced,
        # a CollNet/SHARP job) the cause is elsewhere.
        elif m := re.search(r"[Nn]o algorithm/protocol (?:nor \w+ )?available(?: for function "
                            r"(\w+))?", text):
            forced = re.search(r"NCCL_(ALGO|PROTO) was set to (\S+?)\.?(?:\s|$)", message)
            if forced or not m[1]:
                add("comm.algo-proto-forced", text, file=source, call="algorithm selection",
                    function=m[1] or "", variable=forced and f"NCCL_{forced[1]}={forced[2]}" or "")
        # aws-ofi-nccl could not register CUDA memory (type 2 = FI_HMEM_CUDA) with EINVAL: the
        # libfabric of EFA installers before 1.29.1 under NCCL >= 2.19.
        elif re.search(r"NET/OFI Unable to register memory \(type = 2\).*RC: -22", text):
            add("comm.efa-libfabric-too-old", text, file=source, plugin="aws-ofi-nccl",
                call="fi_mr_regattr")
        elif (ibv := _IBV_CALL.search(text)):
            errno = (ibv["errno"] or "").strip()
            # GPU memory the NIC refuses (EFAULT from the peer-memory path, EOPNOTSUPP from
            # DMA-BUF): GPUDirect RDMA is not usable, not a memory limit.
            if ibv["call"].startswith(("ibv_reg_mr", "ibv_reg_dmabuf_mr")) and re.match(
                    r"Bad address|Operation not supported", errno):
                add("comm.gpu-memory-registration-failed", text, file=source,
                    call=ibv["call"], errno=errno)
            # Pinning memory (reg_mr) or creating queues fails with ENOMEM under a low
            # RLIMIT_MEMLOCK; create_qp failing without an errno is the same limit in old NCCL.
            elif ibv["call"].startswith(("ibv_reg_mr", "ibv_create_cq", "ibv_create_qp")) and (
                    not errno or "Cannot allocate memory" in errno):
                add("comm.memlock-low", text, file=source, call=ibv["call"], errno=errno)
            # QP transition to RTR timing out or unreachable: the address vector (GID) is wrong.
            # (No such device, ENODEV, is a device NCCL cannot use: not this cause.)
            elif ibv["call"] == "ibv_modify_qp" and re.search(r"timed out|unreachable|110", errno):
                add("comm.roce-gid-index", text, file=source, call=ibv["call"], errno=errno,
                    **_gid_parts(text))

    # libibverbs' own lines: a provider library for absent NICs is missing (harmless), versus
    # providers that exist but cannot load against this libibverbs, or none at all.
    for m in _PROVIDER.finditer(message):
        if "IBVERBS_PRIVATE" in m["why"]:
            add("comm.ibverbs-unloadable", m.group(0), provider=m["provider"],
                why="libibverbs ABI older than the provider")
        elif "cannot open shared object file" in m["why"]:
            add("comm.ibverbs-provider-warning-benign", m.group(0), provider=m["provider"])
    if m := re.search(r"no userspace device-specific driver found for \S+|couldn't open config "
                      r"directory '/etc/libibverbs\.d'", message):
        add("comm.ibverbs-unloadable", m.group(0), why="no provider for the device")
    # NCCL's IB scan ended empty ("No device found", an INFO) where IB was wanted (NCCL_IB_HCA
    # or NCCL_NET=IB set, ibv_devinfo pasted) or the verbs device list itself failed: no active
    # RDMA port (drivers or service not loaded, ports down, an HCA filter naming none). On a
    # node without RDMA NICs the line is normal (NVIDIA/nccl#226); a device that will not open
    # is a container's (container.rdma-devices-not-passed), a missing provider is read above.
    text = f"{message}\n{around}"
    failed, empty = _IB_LIST_FAILED.search(message), _NO_IB_DEVICE.search(message)
    intent = _IB_WANTED.search(text)
    if not out and not _IB_OPEN_FAILED.search(text) and (failed or (empty and intent)):
        add("comm.rdma-no-active-device", (failed or empty).group(0),
            wanted=intent.group(0) if intent else "",
            verbs="the device list failed" if _IB_LIST_FAILED.search(text) else "")
    # The interfaces NCCL's socket transport chose: TCP over Slingshot's hsn means the OFI
    # plugin is missing; a bridge/veth next to the real NIC is unreachable from other nodes.
    if m := _SOCKET_LIST.search(message):
        names = _IFACE.findall(m.group(0))
        if names and names[0].startswith("hsn"):
            add("comm.slingshot-no-ofi-plugin", m.group(0), interface=names[0])
        elif (virtual := [n for n in names[1:] if n.startswith(_VIRTUAL)]) and not out:
            add("comm.socket-virtual-interfaces", m.group(0), interface=names[0],
                virtual=",".join(virtual))
    # Gloo takes GLOO_SOCKET_IFNAME as exact interface names: NCCL's ^ (exclude) and = (exact)
    # prefixes, an address, or a name the node lacks are all looked up as a name and not found.
    gloo = _GLOO_IFACE.search(message)
    if gloo and gloo["expr"] != "rp":
        value = gloo["value"].rstrip(".,;:")
        # without the enforce expression, a dotted name with letters after the dot is the
        # host's own name (dgx-1.ai), not an interface (VLANs are eth0.100)
        if gloo["expr"] or _ADDRESS.match(value) or not re.search(r"\.[A-Za-z]", value):
            add("comm.gloo-ifname-invalid", gloo.group(0), variable="GLOO_SOCKET_IFNAME",
                value=value,
                syntax="NCCL's ^ exclusion list" if value.startswith("^") else
                "NCCL's = exact-match prefix" if value.startswith("=") else
                "an address, not an interface name" if _ADDRESS.match(value) else
                "an interface name this node does not have")
    # Gloo refused at a loopback address: the peer bound to what its host name resolved to.
    if m := _GLOO_LOOPBACK.search(message):
        add("comm.gloo-hostname-loopback", m.group(0), address=m["addr"] or m["addr2"],
            port=m["port"] or m["port2"], why="the peer advertised a loopback address")
    # The OFI plugin was built against a newer libfabric than the one the loader found: its
    # FABRIC_x.y symbol version is missing, so the plugin never loads (NCCL falls back).
    if m := re.search(r"libfabric\.so\.1: version [`'](FABRIC_[\d.]+)' not found \(required by "
                      r"(\S*libnccl-net[\w.-]*)", message):
        add("comm.efa-libfabric-too-old", m.group(0), plugin=m[2].rsplit("/", 1)[-1],
            version=m[1])
    # The plugin loader's notice is normal unless something else failed; named only when the
    # message has no other NCCL reading.
    if not out and (m := _PLUGIN.search(message)):
        add("comm.net-plugin-absent-benign", m.group(0),
            plugin=m["lib"] or m["lib2"] or m["lib3"] or "libnccl-net.so")
    if not out and (m := re.search(r"GPU Direct RDMA Disabled for HCA \d+ '?[\w-]*", message)):
        add("comm.gdr-disabled", m.group(0))
    return out
