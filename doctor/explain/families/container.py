"""Containers (Docker with the NVIDIA Container Toolkit, Apptainer/Singularity) read by structure.

A GPU container fails at one of three places, and each says which in its own form:
- starting it: the toolkit's hook prints ``nvidia-container-cli: <stage> error: <what>``
  (initialization: it cannot load the host's NVML, or WSL exposes no GPU adapter; requirement:
  the image's cuda>= condition; container: no cgroup v1 devices controller; mount: a file it
  must inject already exists in the image, or a rootless runtime may not edit the device
  cgroup), Docker's daemon refuses the GPU request (``could not select device driver "" with
  capabilities: [[gpu]]``, ``Unknown runtime specified nvidia``), a CDI device name resolves
  to no spec, Apptainer cannot create its namespaces or a bind point;
- binding the GPU in: Apptainer's --nv finds no driver files on the host, or a flag placed
  after the image runs as the container's command (``exec: --nv: not found``);
- inside it: NVML's "Unknown Error" once the device cgroup was rewritten, "Insufficient
  Permissions" under SELinux, the NGC images' "NVIDIA Driver was not detected" banner,
  ROCm's /dev/kfd missing from the container's /dev, RDMA devices listed in sysfs but not
  openable (no /dev/infiniband passed in), and NCCL's sockets failing on Docker's default
  bridge network (the line's host is the container id, or the peer's address is a bridge
  address).
Each is read into its parts (the stage, the library, the CUDA, the path, the flag): they name
the cause."""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "container"
IC = re.IGNORECASE

# runc's exec of the container's command: nvidia-smi comes only from the host's driver
NO_NVIDIA_SMI = re.compile(r'exec: \\*"nvidia-smi\\*": executable file not found in \$PATH')
# The ldcache stage's ldconfig (config.toml's `ldconfig`): a path the host lacks, or exit 127
LDCONFIG = re.compile(r"(?:open failed: |process )(?P<path>\S*ldconfig[^:\s]*):? ?(?:no such "
                      r"file or directory|failed with error code: 127)", re.IGNORECASE)
# nvidia-container-cli names the stage that failed; the GPU operator's image runs it as
# nvidia-container-cli.real (k8s-device-plugin#324).
CLI = re.compile(r"nvidia-container-cli(?:\.real)?: (?P<stage>[a-z]+) error: (?P<what>[^\n]*)", IC)
# The container stage on a cgroup v2 host with a library that only knows v1's devices
# controller (libnvidia-container < 1.8), or a hybrid layout it cannot parse.
CGROUP_V1_ONLY = re.compile(r"cgroup subsystem devices not found|failed to get device cgroup root "
                            r"path: malformed cgroup entry", IC)
# The mount stage may not edit the device cgroup: a rootless runtime (v2: querying the eBPF
# device filter is not permitted; v1: devices.allow is not writable).
CGROUP_DENIED = re.compile(r"bpf_prog_query\(BPF_CGROUP_DEVICE\) failed: operation not permitted"
                           r"|open failed: (?P<file>/sys/fs/cgroup/devices/\S*devices\.allow): "
                           r"permission denied", IC)
WSL_NO_ADAPTER = re.compile(r"WSL environment detected but no adapters were found", IC)
# CDI (Podman, containerd, Docker >= 25): the requested name is in no spec under /etc/cdi or
# /var/run/cdi.
# (Podman before 4.1 has no CDI: it takes the device name for a file and stats it)
CDI_UNRESOLVED = re.compile(r"unresolvable CDI devices? (?P<devices>[^\s:]+)|\bstat (?P<devices2>[a-z0-9.-]+\."
                            r"[a-z]{2,}/[a-z0-9._-]+=[\w.:-]+): no such file or directory", IC)
# RDMA devices listed (sysfs) but not openable (/dev/infiniband/uverbsN): NCCL's IB transport,
# libfabric's efa provider; and aws-ofi-nccl's RDMA protocol finding no EFA
# device (ENODATA) on a platform that has them.
IB_OPEN_FAILED = re.compile(r"NET/IB ?: Unable to open device (?P<device>\S+)|Call to "
                            r"ibv_open_device failed|ibv_open_device failed! errno: (?P<errno>\d+)",
                            IC)
OFI_RDMA_NODATA = re.compile(r"nccl_net_ofi_rdma_init:\d+ NCCL WARN NET/OFI OFI fi_getinfo\(\) "
                             r"call failed: No data available", IC)
LOAD_FAILED = re.compile(r"load library failed: (?P<lib>lib[\w.+-]+\.so[.\d]*)", IC)
REQUIRE = re.compile(r"unsatisfied condition: (?P<cond>cuda ?>= ?(?P<cuda>[0-9.]+))", IC)
UNKNOWN_DEVICE = re.compile(r"(?P<device>[^\s:]+): unknown device", IC)
EXISTS = re.compile(r"file creation failed: (?P<path>\S+): file exists", IC)
# Docker's daemon has no driver for --gpus, or no runtime called nvidia.
NO_GPU_DRIVER = re.compile(r"could not select device driver \"(?P<driver>[^\"]*)\" with "
                           r"capabilities: \[\[(?P<caps>[^\]]*)", IC)
# ... asked of Docker on a Mac: Docker Desktop passes no GPU there (MeloTTS#40)
MAC = re.compile(r"\b(?:mac ?OS|MacBook|Macintosh|Apple (?:Silicon|M[1-9])|M[1-9] (?:Pro|Max|Ultra"
                 r"|chip))\b", IC)
# (enroot's 98-nvidia.sh hook: "[ERROR] Command not found: nvidia-container-cli, see ...")
# The binary dockerd or the runtime is configured to call is gone (the package uninstalled, or
# the hook renamed nvidia-container-toolkit in a partial upgrade): "fork/exec
# /usr/bin/nvidia-container-runtime: no such file" (nvidia-docker#686), "inject NVIDIA hook: stat
# /usr/bin/nvidia-container-runtime-hook: no such file" (nvidia-docker#1017).
NO_HOOK = re.compile(r"(?P<binary>nvidia-container-(?:runtime-hook|runtime|cli))\W{0,8}: executable "
                     r"file not found in \$PATH|(?:couldn't find binary|Command not found:) "
                     r"(?P<cli>nvidia-container-cli)"
                     r"|(?:fork/exec|inject NVIDIA hook: stat) \S*/(?P<gone>nvidia-(?:container-"
                     r"(?:runtime-hook|runtime|toolkit)|cdi-hook|ctk)): no such file or directory", IC)
# Docker before 23 says "Unknown runtime specified nvidia", later releases "unknown or invalid
# runtime name: nvidia" (3dgrut#71, AirSLAM#113)
NO_RUNTIME = re.compile(r"(?:Unknown runtime specified|unknown or invalid runtime name:) "
                        r"(?P<runtime>[\w.-]+?)\.?(?:[\s\"']|$)", IC)
# containerd's CRI: the RuntimeClass names a runtime its config lacks (gpu-operator#432)
CRI_NO_RUNTIME = re.compile(r'no runtime for \\?"?(?P<runtime>[\w.-]+?)\\?"? is configured', IC)
NV_NOTHING = re.compile(r"Could not find any (?:nv files|NVIDIA (?:libraries|binaries)) on this "
                        r"host", IC)
ACTION_NOT_FOUND = re.compile(r"\.singularity\.d/actions/(?P<action>\w+): (?:line )?\d+: exec: "
                              r"(?P<command>\S+): not found", IC)
# Apptainer/Singularity (Ubuntu >= 24.04's AppArmor confines the namespace it lets them create:
# no write to /proc/PID/setgroups, apptainer#2457, #2691), Charliecloud's ch-run.
USERNS = re.compile(r"Failed to create (?:user|mount) namespace: (?P<why>[^\n]+)"
                    r"|user namespaces? (?:is |are )?(?:disabled|not enabled)"
                    r"|can't init user\+mount namespaces: (?P<ch>Operation not permitted)"
                    r"|(?:^|\n)\W*ERROR\s*:\s*Failed to create container namespaces\s*(?:\n|$)"
                    r"|Could not write info to setgroups: (?P<setgroups>Permission denied)", IC)
# --nv without overlay: a notice of how many binds the underlay took, the GPU is bound.
UNDERLAY = re.compile(r"underlay of (?P<path>/\S+) required more than \d+ (?:\((?P<count>\d+)\) )?"
                      r"bind mounts", IC)
# Apptainer's pull/build temp dirs (bundle-temp-*, build-temp-*) on a file system that is full,
# or the SIF unpacked into a temporary sandbox (rootfs-*/archive-*) where there is no room or
# no quota left (no squashfuse, or --userns: the whole image is extracted under the temp dir).
BUILD_ENOSPC = re.compile(r"(?P<dir>/\S*?/)(?:bundle|build|oci)-temp-\S*[^\n]*?no space left on "
                          r"device|root filesystem extraction failed: [^\n]*?write (?P<sandbox>/\S*?/)"
                          r"(?:rootfs-\d+/)?archive-\d+: (?:no space left on device|disk quota "
                          r"exceeded)", IC)
# pyxis/enroot writing the image's squashfs (mksquashfs) where there is no room.
SQUASHFS_ENOSPC = re.compile(r"Write failed because No space left on device|Failed to write to "
                             r"output filesystem", IC)
SQUASHFS_TARGET = re.compile(r"Creating [0-9.]+ filesystem on (?P<path>[^,\s]+)", IC)
# enroot's runtime folder (ENROOT_RUNTIME_PATH, default ${XDG_RUNTIME_DIR}/enroot) refused by
# the shell's mkdir: XDG_RUNTIME_DIR unset (enroot falls back to /run: /run/enroot) or naming a
# /run/user/UID that no login session created (a Slurm step, an AD/LDAP account).
RUNTIME_MKDIR = re.compile(r"mkdir: cannot create directory [\u2018'`\"]?(?P<dir>/run/(?:enroot(?:/[^\s'\u2019`\"]*)?|"
                           r"user/(?P<uid>\d+)))[\u2019'`\"]?: Permission denied", IC)
# pyxis takes --container-image as a registry image unless it starts with / or ./: a squashfs
# file named bare (image.sqsh, dir/image.sqsh) is looked up on Docker Hub as library/image.sqsh.
SQSH_AS_IMAGE = re.compile(r"pyxis: importing docker image(?: \.\.\.)?:? (?!/|\./|\.\./)"
                           r"(?:docker://)?(?P<image>[^\s#]+\.(?:sqsh|squashfs))\b"
                           r"|registry-1\.docker\.io/v2/library/(?P<hub>[^\s/]+\.(?:sqsh|squashfs))/"
                           r"manifests/", IC)
# enroot asked Docker Hub for a repository whose first component is a host name: the URI
# used '/' after another registry where enroot wants '#' (Docker Hub names hold no dots).
HUB_WITH_HOST = re.compile(r"registry-1\.docker\.io/v2/(?P<registry>[a-z0-9-]+(?:\.[a-z0-9-]+)+"
                           r"(?::\d+)?)/(?P<image>\S*?)/manifests/", IC)
BIND_DEST = re.compile(r"destination (?P<dest>\S+) doesn't exist in container|Skipping user bind, "
                       r"non existent bind point (?:\(\w+\) )?in container: '?(?P<point>[^'\s]+)"
                       r"|(?P<libs>Library bind directory) not present in container", IC)
# The node's nvidia_uvm module (and so /dev/nvidia-uvm) is absent: runtimes cannot load it.
UVM = re.compile(r"Kernel module nvidia_uvm is not loaded|/dev/nvidia-uvm\S*: no such file or "
                 r"directory|Could not load UVM kernel module", IC)
# nvidia-docker 1 names the driver's volume after its version; a container (or a plugin not
# restarted) from before a driver change asks for the old one (nvidia-docker#493, #416), as
# a CDI spec generated for the previous driver makes crun stat that driver's files.
OLD_DRIVER_VOLUME = re.compile(r"no such volume: ?(?P<volume>nvidia_driver_(?P<version>[0-9.]+"
                               r"\d))|(?:cannot stat|error stat'ing file) `?/\S*?(?:nvidia|libcuda)"
                               r"\S*?\.so\.(?P<cdi>\d+(?:\.\d+)+)`?: No such file or directory", IC)
# The hook after the driver was replaced under a running dockerd (nvidia-docker#1068)
DRIVER_PROCFS_GONE = re.compile(r"mount error: mount operation failed: \S*?/proc/driver/nvidia/"
                                r"(?P<file>[\w/]+): no such file or directory", IC)
# Inside the container:
NVML = re.compile(r"Failed to initialize NVML: (?P<why>Unknown Error|Insufficient Permissions)",
                  IC)
# NVIDIA's Kubernetes device plugin started by the default runtime (runc): no driver libraries
# were injected into its pod (k8s-device-plugin#11, #23).
PLUGIN_NO_NVML = re.compile(r"Loading NVML\s*\n(?:[^\n]*\n)?[^\n]*could not load NVML library"
                            r"|did you set the docker default runtime to .nvidia.", IC)
# Kubernetes' scheduler: no node has the GPUs the pod asks for ("0/3 nodes are available: 3
# Insufficient nvidia.com/gpu"); the counts where the event line is whole
K8S_NO_GPU_NODE = re.compile(r"(?:(?P<free>\d+)/(?P<nodes>\d+) nodes are available:[^\n]*?"
                             r"(?P<short>\d+) )?[Ii]nsufficient nvidia\.com/gpu\b")
# glibc >= 2.34 creates threads with clone3; an old engine's seccomp profile answers EPERM
# (limits answer EAGAIN): OpenBLAS's, Go's cgo and glibc users' words for it
CLONE3_EPERM = re.compile(r"(?P<who>OpenBLAS blas_thread_init|runtime/cgo|\w+)?:? ?pthread_create "
                          r"failed(?: for thread \d+ of \d+)?: Operation not permitted", IC)
# NGC images' entrypoint banner: the driver release the image needs and the one it found
NGC_DRIVER = re.compile(r"built for NVIDIA Driver Release (?P<needs>[0-9.]+) or later, but\s*"
                        r"version (?P<has>[0-9.]+) was detected and compatibility mode is "
                        r"UNAVAILABLE", IC)
# Docker Hub's anonymous pull limit (per outgoing address): the daemon's, enroot's, kubelet's
RATE_LIMIT = re.compile(r"toomanyrequests:? You have reached your (?:unauthenticated )?pull rate "
                        r"limit|TOOMANYREQUESTS\W+message\W+You have reached your (?:unauthenticated"
                        r" )?pull rate limit|registry-1\.docker\.io/v2/\S+(?: returned error code:?|:) 429",
                        IC)
ANONYMOUS = re.compile(r"Authenticating with user: <anonymous>", IC)
# Singularity < 3.5.3 mounts squashfs with errors=remount-ro, which kernels >= 5.1 refuse
OLD_SQUASHFS_MOUNT = re.compile(r"failed to mount squashfs filesystem: invalid argument|Failed to "
                                r"mount squashfs image in \(read only\): Invalid argument"
                                r"|squashfs: Unknown parameter '?errors'?", IC)
# rootless Podman/Buildah with the user's own ID mapped alone: a layer file owned by another ID
USERNS_IDS = re.compile(r"(?:potentially insufficient UIDs or GIDs available in user namespace|"
                        r"there might not be enough IDs available in the namespace) \(requested "
                        r"(?P<ids>\d+:\d+) for (?P<path>[^)]+)\)|using rootless single mapping "
                        r"into the namespace", IC)
NGC_NO_DRIVER = re.compile(r"The NVIDIA Driver was not detected\.\s+GPU functionality will not "
                           r"be available", IC)
NO_LOOP = re.compile(r"failed to find loop device: (?P<why>could not attach image file to loop "
                     r"device: no loop devices available|[^\n]*)", IC)
KFD_MISSING = re.compile(r"Unable to open /dev/kfd read-write: No such file or directory", IC)
# rocminfo cannot name the user inside a container (its uid is not in the image's passwd).
NO_USER_NAME = re.compile(r"Failed to get user name to check for (?:video|render) group", IC)
# Docker names a container's host after the first 12 hex digits of its id, and NCCL starts
# each line with HOST:PID:TID [DEV]: such a host is a container (a letter and a digit in it,
# so neither a number nor a word passes for an id).
DOCKER_HOST = re.compile(r"(?<![\w.-])(?P<host>(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{12})"
                         r":\d+:\d+ \[\d+\]")
# Docker's default bridge is 172.17.0.0/16 with the host's docker0 at .1 and the containers
# numbered from 172.17.0.2: a rank that connects to such an address talks to a peer that
# advertised its container-private address.
BRIDGE_PEER = re.compile(r"Connect to (?P<addr>172\.17\.0\.(?!1<)\d{1,3})<\d+>", IC)
BRIDGE_OWN = re.compile(r"\[\d+\](?P<iface>eth\d+):(?P<addr>172\.17\.0\.(?!1<)\d{1,3})<", IC)
# NCCL's bootstrap socket failing for want of an interface or an address it may bind.
NCCL_NO_NET = re.compile(r"Socket creation failed : Address family not supported by protocol"
                         r"|Call to bind failed : Cannot assign requested address"
                         r"|No usable listening interface found"
                         r"|No interface found in the same subnet as remote address "
                         r"(?P<remote>\S+)", IC)


def docker_host(message: str) -> str:
    """The container id NCCL's line prefix names ('' on a host that is not a container)."""
    found = DOCKER_HOST.search(message)
    return found["host"] if found else ""


def _network(message: str) -> Reading | None:
    """NCCL across a Docker bridge: a peer's bridge address, or no interface/address to use."""
    host, own = docker_host(message), BRIDGE_OWN.search(message)
    peer = BRIDGE_PEER.search(message)
    if peer:  # the other rank advertised the private address only its own host can reach
        return reading(FAMILY, "container.network-isolation", peer.group(0),
                       peer=peer["addr"], container=host,
                       network="Docker's default bridge (172.17.0.0/16)")
    failed = NCCL_NO_NET.search(message)
    if host and failed:  # a container with no interface, or none on the hosts' network
        what = failed.group(0).lower()
        return reading(FAMILY, "container.network-isolation", failed.group(0), container=host,
                       failure="no IP interface" if "family" in what else
                       "cannot bind the address asked for" if "bind" in what else
                       "no interface on the peers' network",
                       remote=(failed["remote"] or "").split("<")[0],
                       address=f"{own['iface']} {own['addr']}" if own else "")
    return None


def _rdma(message: str) -> Reading | None:
    """An RDMA device listed but not openable, or the EFA plugin finding none: the container
    did not get /dev/infiniband."""
    found = list(IB_OPEN_FAILED.finditer(message))
    if found:  # NCCL's wrapper line first, its "Unable to open device NAME" after it
        device = next((m["device"] for m in found if m["device"]), "")
        errno = next((m["errno"] for m in found if m["errno"]), "")
        return reading(FAMILY, "container.rdma-devices-not-passed", found[0].group(0),
                       device=device, errno=errno, container=docker_host(message))
    if nodata := OFI_RDMA_NODATA.search(message):
        return reading(FAMILY, "container.rdma-devices-not-passed", nodata.group(0),
                       plugin="aws-ofi-nccl", provider="efa")
    return None


DOCKER_PROMPT = re.compile(r"^\S*root@(?P<id>[0-9a-f]{12}):", re.MULTILINE)


def read(message: str, around: str = "") -> list[Reading]:
    if not message:
        return []
    found: list[Reading] = []
    if network := _network(message):
        found.append(network)
    cli = CLI.search(message)
    if cli:
        stage, what = cli["stage"].lower(), cli["what"]
        lib, req, exists = LOAD_FAILED.search(what), REQUIRE.search(what), EXISTS.search(message)
        if stage == "initialization" and lib and "nvidia-ml" in lib["lib"]:
            # The hook loads the HOST's NVML before anything else: no driver on the host
            found.append(reading(FAMILY, "container.host-driver-missing", cli.group(0),
                                 stage=stage, library=lib["lib"]))
        elif stage == "initialization" and "driver not loaded" in what.lower():
            # NVML answers but the host's kernel module is not loaded
            found.append(reading(FAMILY, "container.host-driver-missing", cli.group(0),
                                 stage=stage, nvml="driver not loaded"))
        elif stage == "device" and UNKNOWN_DEVICE.search(what):
            # A GPU index/UUID the host's NVML does not list (--gpus 2 on a one-GPU node)
            found.append(reading(FAMILY, "container.requested-gpu-not-present", cli.group(0),
                                 stage=stage, device=UNKNOWN_DEVICE.search(what)["device"]))
        elif stage == "requirement" and req:
            # The image's NVIDIA_REQUIRE_CUDA is newer than what the host driver supports
            found.append(reading(FAMILY, "container.driver-too-old-for-image", cli.group(0),
                                 stage=stage, requires=req["cond"], cuda=req["cuda"]))
        elif stage == "container" and CGROUP_V1_ONLY.search(what):
            # The hook looked for cgroup v1's devices controller on a unified-hierarchy host
            found.append(reading(FAMILY, "container.toolkit-lacks-cgroup-v2", cli.group(0),
                                 stage=stage, cgroup=CGROUP_V1_ONLY.search(what).group(0)))
        elif stage == "mount" and CGROUP_DENIED.search(what):
            # Not allowed to edit the device cgroup: a rootless runtime without no-cgroups
            denied = CGROUP_DENIED.search(what)
            found.append(reading(FAMILY, "container.rootless-device-cgroup", cli.group(0),
                                 stage=stage, cgroup="v1 " + denied["file"] if denied["file"]
                                 else "v2 eBPF device filter"))
        elif stage == "ldcache" and (ld := LDCONFIG.search(what)):
            # The hook runs the ldconfig its config.toml names: missing, or not runnable there
            found.append(reading(FAMILY, "container.toolkit-ldconfig-path-wrong", cli.group(0),
                                 stage=stage, ldconfig=ld["path"]))
        elif stage == "mount" and exists:
            # A file the hook injects from the host is already in the image
            found.append(reading(FAMILY, "container.image-ships-driver-libs", exists.group(0),
                                 stage=stage, path=exists["path"]))
    elif EXISTS.search(message) and re.search(r"libnvidia|libcuda|nvidia-smi",
                                              EXISTS.search(message)["path"]):
        # The same mount error when the hook's name was cut off by the wrapping of the line
        found.append(reading(FAMILY, "container.image-ships-driver-libs",
                             EXISTS.search(message).group(0), path=EXISTS.search(message)["path"]))
    if "Driver/library version mismatch" in message and (
            prompt := DOCKER_PROMPT.search(message) or DOCKER_PROMPT.search(around)):
        # NVML's mismatch inside a container (Docker's default host name: 12 hex digits): the
        # image's own driver libraries, not the host's, are older or newer than the module
        found.append(reading(FAMILY, "container.image-ships-driver-libs", prompt.group(0),
                             container=prompt["id"], nvml="Driver/library version mismatch"))
    if exe := NO_NVIDIA_SMI.search(message):
        # runc starting the container's command finds no nvidia-smi: nothing injected the
        # driver's binaries (no GPU runtime for this container, nvidia-docker 1's volume)
        found.append(reading(FAMILY, "container.no-gpu-runtime", exe.group(0),
                             program="nvidia-smi", runtime="runc (no NVIDIA hook ran)"))
    if wsl := WSL_NO_ADAPTER.search(message):
        # The toolkit's initialization under WSL, where the GPU comes through the Windows
        # driver (/dev/dxg): WSL exposes no adapter (its name is sometimes mistyped in pastes)
        found.append(reading(FAMILY, "container.wsl-no-gpu-adapter", wsl.group(0),
                             stage="initialization", platform="WSL"))
    if cdi := CDI_UNRESOLVED.search(message):
        found.append(reading(FAMILY, "container.cdi-spec-unresolved", cdi.group(0),
                             device=(cdi["devices"] or cdi["devices2"]).strip("[]"),
                             runtime="kubelet" if "inject CDI devices" in message else ""))
    if rdma := _rdma(message):
        found.append(rdma)
    uvm = UVM.search(message)
    if uvm:
        found.append(reading(FAMILY, "container.nvidia-uvm-not-loaded", uvm.group(0),
                             module="nvidia_uvm", device="/dev/nvidia-uvm"))
    if gone := DRIVER_PROCFS_GONE.search(message):
        found.append(reading(FAMILY, "container.stale-after-driver-change", gone.group(0)[:160],
                             missing=f"/proc/driver/nvidia/{gone['file']}"))
    elif old := OLD_DRIVER_VOLUME.search(message):
        found.append(reading(FAMILY, "container.stale-after-driver-change", old.group(0),
                             volume=old["volume"] or "a CDI spec", driver=old["version"] or old["cdi"]))
    daemon = NO_GPU_DRIVER.search(message)
    if daemon and (mac := MAC.search(f"{message}\n{around}")):
        found.append(reading(FAMILY, "gpu.no-gpu-on-node", daemon.group(0), platform=mac.group(0)))
        daemon = None
    runtime = NO_RUNTIME.search(message) or CRI_NO_RUNTIME.search(message)
    hook = NO_HOOK.search(message)
    if daemon or hook or (runtime and "nvidia" in runtime["runtime"].lower()):
        # dockerd knows no GPU device driver / no nvidia runtime, or the toolkit's binaries it
        # is configured to call are gone: the toolkit is not set up
        found.append(reading(FAMILY, "container.nvidia-toolkit-broken",
                             (daemon or hook or runtime).group(0),
                             driver=daemon["driver"] if daemon else "",
                             runtime=runtime["runtime"] if runtime else "",
                             missing=(hook["binary"] or hook["cli"] or hook["gone"])
                             if hook else ""))
    if NV_NOTHING.search(message):
        found.append(reading(FAMILY, "container.nv-host-libs-not-found",
                             NV_NOTHING.search(message).group(0)))
    action = ACTION_NOT_FOUND.search(message)
    if action and action["command"].startswith("-"):
        # An option ran as the command: it was written after the image, so it was never an
        # option (--nv/--rocm not given)
        found.append(reading(FAMILY, "container.apptainer-no-nv", action.group(0),
                             action=action["action"], flag=action["command"]))
    elif action and action["command"] in ("nvidia-smi", "rocm-smi", "rocminfo"):
        # --nv/--rocm bound no driver tools: none were found where it looks on the host
        found.append(reading(FAMILY, "container.nv-host-libs-not-found", action.group(0),
                             action=action["action"], command=action["command"]))
    userns = USERNS.search(message)
    # EINVAL from enroot's user namespace is no disabled-namespace signal: enroot writes a uid
    # above 2^31 negative into uid_map (enroot#195); a disabled namespace says EPERM/ENOSPC.
    if userns and not re.match(r"Invalid argument", userns["why"] or "", IC):
        found.append(reading(FAMILY, "container.apptainer-userns-disabled", userns.group(0),
                             why=(userns["why"] or userns["ch"] or "").strip() or (
                                 "setgroups refused in the new user namespace (AppArmor)"
                                 if userns["setgroups"] else "")))
    enospc = BUILD_ENOSPC.search(message)
    if enospc:  # the image is unpacked under APPTAINER_TMPDIR: that file system is too small
        found.append(reading(FAMILY, "container.apptainer-tmpdir-full", enospc.group(0),
                             temp_dir=enospc["dir"] or enospc["sandbox"],
                             step="the SIF unpacked to a temporary sandbox" if enospc["sandbox"]
                             else "the image built from its layers"))
    if SQUASHFS_ENOSPC.search(message) and re.search(r"pyxis|enroot", message, IC):
        # mksquashfs inside pyxis/enroot ran out of space where the image is unpacked
        target = SQUASHFS_TARGET.search(message)
        found.append(reading(FAMILY, "container.pyxis-runtime-path-full",
                             SQUASHFS_ENOSPC.search(message).group(0),
                             squashfs=target["path"] if target else ""))
    if runtime_dir := RUNTIME_MKDIR.search(message):
        found.append(reading(FAMILY, "container.enroot-runtime-path-not-writable",
                             runtime_dir.group(0), directory=runtime_dir["dir"],
                             why=("XDG_RUNTIME_DIR names /run/user/UID, which no login session "
                                  "created on this node") if runtime_dir["uid"] else
                             "XDG_RUNTIME_DIR unset: enroot fell back to /run",
                             variable="ENROOT_RUNTIME_PATH",
                             via="pyxis" if "pyxis" in message.lower() else ""))
    if sqsh := SQSH_AS_IMAGE.search(message):
        found.append(reading(FAMILY, "container.pyxis-sqsh-path-as-image", sqsh.group(0),
                             file=sqsh["image"] or sqsh["hub"],
                             write="./" + (sqsh["image"] or sqsh["hub"]) + " or an absolute path"))
    hub = HUB_WITH_HOST.search(message)
    if hub:
        found.append(reading(FAMILY, "container.enroot-registry-uri-without-hash", hub.group(0),
                             registry=hub["registry"], image=hub["image"],
                             write=f"{hub['registry']}#{hub['image']}"))
    dest = BIND_DEST.search(message)
    if dest:
        found.append(reading(FAMILY, "container.bind-destination-missing", dest.group(0),
                             destination=dest["dest"] or dest["point"] or
                             ("/.singularity.d/libs" if dest["libs"] else "")))
    nvml = NVML.search(message)
    if nvml:
        # NVML inside a container: "Unknown Error" once the device cgroup lost the GPUs,
        # "Insufficient Permissions" when the host's SELinux labels deny the devices
        mode = ("container.gpu-lost-after-daemon-reload" if nvml["why"].lower().startswith(
            "unknown") else "container.selinux-blocks-driver-libs")
        found.append(reading(FAMILY, mode, nvml.group(0), nvml=nvml["why"]))
    if plugin := PLUGIN_NO_NVML.search(message):
        found.append(reading(FAMILY, "container.no-gpu-runtime", plugin.group(0).split("\n")[-1],
                             program="k8s-device-plugin", library="libnvidia-ml.so.1"))
    if eperm := CLONE3_EPERM.search(message):
        found.append(reading(FAMILY, "container.seccomp-blocks-clone3", eperm.group(0),
                             call="pthread_create (clone3)", error="EPERM",
                             caller=eperm["who"] or ""))
    if ngc := NGC_DRIVER.search(message):
        found.append(reading(FAMILY, "container.driver-too-old-for-image", ngc.group(0)[:100],
                             image_needs_driver=ngc["needs"], host_driver=ngc["has"]))
    if limit := RATE_LIMIT.search(message):
        found.append(reading(FAMILY, "container.registry-pull-rate-limit", limit.group(0)[:100],
                             registry="Docker Hub", status="429",
                             pull="anonymous" if ANONYMOUS.search(message) else ""))
    if squashfs := OLD_SQUASHFS_MOUNT.search(message):
        found.append(reading(FAMILY, "container.singularity-too-old-for-kernel", squashfs.group(0),
                             runtime="Singularity 2.x" if "read only" in squashfs.group(0) else
                             "Singularity < 3.5.3", refused="squashfs errors=remount-ro"))
    if ids := USERNS_IDS.search(message):
        found.append(reading(FAMILY, "container.rootless-userns-single-id", ids.group(0)[:120],
                             requested=ids["ids"] or "", file=ids["path"] or ""))
    if k8s := K8S_NO_GPU_NODE.search(message):
        found.append(reading(FAMILY, "container.k8s-gpu-request-exceeds-node", k8s.group(0),
                             nodes=k8s["nodes"] or "", without_enough=k8s["short"] or ""))
    if NGC_NO_DRIVER.search(message):
        # The NGC images' entrypoint found no driver: the container was started without --gpus
        found.append(reading(FAMILY, "container.no-gpu-runtime",
                             NGC_NO_DRIVER.search(message).group(0)))
    loop = NO_LOOP.search(message)
    if loop and "no loop devices" in loop["why"].lower():
        # The setuid runtime mounts the SIF through a loop device and the node had none free
        found.append(reading(FAMILY, "container.apptainer-no-loop-devices", loop.group(0),
                             runtime="apptainer" if "apptainer" in message.lower()
                             else "singularity"))
    kfd = KFD_MISSING.search(message)
    if kfd:
        # rocminfo only gets to /dev/kfd when the kernel module is loaded: the node has it, the
        # container's /dev does not (no --rocm, --containall without binding /dev/kfd)
        found.append(reading(FAMILY, "container.apptainer-no-nv", kfd.group(0), device="/dev/kfd",
                             inside=("a container (its uid is not in the image's passwd)"
                                     if NO_USER_NAME.search(message) else "")))
    underlay = UNDERLAY.search(message)
    if underlay and not found:  # only alone: beside another reading it is never the cause
        found.append(reading(FAMILY, "container.apptainer-underlay-notice-benign",
                             underlay.group(0), path=underlay["path"],
                             binds=underlay["count"] or ""))
    return found
