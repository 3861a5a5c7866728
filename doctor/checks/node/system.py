"""system: OS, Python, CPU, memory, /dev/shm, the temporary folder, locked memory, open files,
Slurm allocation, container."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

import psutil
from packaging.version import Version

from dsenv.data import load_table
from dsenv.doctor.catalogue import mode_fact, mode_finding
from dsenv.doctor.checks.node.gpu import slurm_gpu_variables
from dsenv.doctor.checks.software.builds import hung
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.host import cachefs, mounts, tempdir
from dsenv.facts.host import machine as host
from dsenv.facts.node import SEARCH_PATHS, unanswered_folders
from dsenv.facts.python import target_env
from dsenv.redact import show_variable
from dsenv.verdicts.findings import fail, info, ok, skip, warn

GIB = 1 << 30
MIN_PYTHON = (3, 9)  # DeepSpeed's own floor
SHM_WARN_BYTES = 1 * GIB  # NCCL and DataLoader workers keep their buffers here
SHM_FAIL_BYTES = 256 << 20  # Docker's 64 MB default breaks NCCL's shared-memory transport
LOW_MEMORY_BYTES = 16 * GIB
# pip stages a wheel and builds sdists in the temporary folder: a CUDA torch or nvidia-* wheel
# is 1-3 GB, and an Apptainer build stages whole layers there.
TMP_WARN_BYTES = 4 * GIB
TMP_FAIL_BYTES = 1 * GIB


@check("system.os", "Operating system")
def operating_system(ctx: Context):
    release = host.os_release(ctx)
    name = release.get("PRETTY_NAME") or platform.system()
    summary = f"{name}, kernel {platform.release()}, {platform.machine()}"
    libc, libc_version = platform.libc_ver()
    minimum = load_table("dsenv.envs", "training_stack.toml")["system"]["min_glibc"]
    if libc == "glibc" and Version(libc_version) < Version(minimum):
        return mode_finding(warn, "loader.glibc-too-old",
                            f"{summary}; glibc {libc_version} is older than {minimum}: current "
                            "PyTorch wheels (manylinux_2_28) will not install or load",
                            here="run in a container with a newer OS (`dsenv provision --kind "
                            "container`) or use a conda environment, which brings its own "
                            "libraries")
    return ok(f"{summary}, {libc} {libc_version}".rstrip(", "))


@check("system.python", "Python version")
def python_version(ctx: Context):
    """The job's interpreter (the environment under test), not dsenv's own."""
    env = target_env.environment(ctx)
    if env.version is None:
        return skip(f"no interpreter in {env.prefix} to ask: see python.interpreter")
    numbers = tuple(int(n) for n in env.version.split(".")[:2] if n.isdigit())
    if numbers < MIN_PYTHON:
        return fail(f"Python {env.version} is older than DeepSpeed supports",
                    "create the environment with Python >= 3.9: `dsenv provision`",
                    f"interpreter: {env.python}")
    return ok(f"Python {env.version} ({env.implementation})")


@check("system.cpu", "CPU and SIMD flags")
def cpu_flags(ctx: Context):
    cpu = host.cpu(ctx)
    summary = f"{cpu.model}, {cpu.logical_cpus} logical CPUs"
    if cpu.arch not in ("x86_64", "AMD64"):
        return ok(f"{summary} ({cpu.arch})")
    has_avx512 = "avx512f" in cpu.flags
    has_avx2 = "avx2" in cpu.flags
    simd = "AVX-512" if has_avx512 else "AVX2" if has_avx2 else "no AVX2"
    if not has_avx2:
        return mode_finding(warn, "system.cpu-lacks-isa",
                            f"{summary}; {simd}: DeepSpeed's cpu_adam falls back to slow scalar "
                            "code", "flags seen: " + " ".join(
                                sorted(f for f in cpu.flags if f.startswith(("sse", "avx")))),
                            here="run CPU-offload jobs (zero3-offload) on nodes with AVX2 or "
                            "AVX-512")
    return ok(f"{summary}, {simd}")


@check("system.memory", "Memory")
def memory(ctx: Context):
    mem = psutil.virtual_memory()
    summary = f"{mem.total / GIB:.1f} GiB total, {mem.available / GIB:.1f} GiB available"
    if ctx.is_compute and mem.total < LOW_MEMORY_BYTES:
        return mode_finding(warn, "system.host-oom-killed",
                            summary + ": little for DeepSpeed CPU offload and data loading",
                            here="request more memory (`#SBATCH --mem=...`) or avoid the "
                            "*-offload presets")
    return ok(summary)


def shm_size(ctx: Context) -> int | None:
    shm = ctx.path("/dev/shm")
    if not shm.is_dir():
        return None
    stats = os.statvfs(shm)
    return stats.f_frsize * stats.f_blocks


SHM = "system.shm-too-small"  # the catalogue mode of every system.shm failure


@check("system.shm", "/dev/shm size")
def dev_shm(ctx: Context):
    size = shm_size(ctx)
    if size is None:
        return mode_finding(fail, SHM, "/dev/shm is missing", here="mount a tmpfs on /dev/shm "
                            "(containers: --shm-size=8g for Docker, or bind the host's /dev/shm)")
    human = f"{size / GIB:.2f} GiB" if size >= GIB else f"{size >> 20} MiB"
    fix = ("give the container a bigger /dev/shm: `docker run --shm-size=8g`, or bind the "
           "host's: `-B /dev/shm` (Singularity/Apptainer)")
    if size < SHM_FAIL_BYTES:
        finding = fail if ctx.is_compute else warn
        return mode_finding(finding, SHM, f"/dev/shm is {human}: NCCL and DataLoader workers "
                            "fail with 'No space left on device' or bus errors", here=fix)
    if size < SHM_WARN_BYTES:
        return mode_finding(warn, SHM, f"/dev/shm is {human}; multi-GPU jobs need several GiB",
                            here=fix)
    return ok(f"/dev/shm is {human}")


@check("system.tmpdir", "Temporary folder room (TMPDIR)")
def temp_folder_room(ctx: Context):
    folder = tempdir.temp_folder(ctx)
    if folder is None:
        return skip("no temporary folder exists (TMPDIR, TEMP, TMP, /tmp, /var/tmp)")
    evidence = [f"{v}: not a folder, so tempfile skips it" for v in folder.ignored]
    if folder.hung:
        return warn(hung("temporary folder", folder.path),
                    f"export TMPDIR={_roomy_folder(ctx)}", *evidence)
    if folder.free is None:
        return skip(f"{folder.describe()}: its free space could not be read "
                    f"(`stat -f` gave no answer in {tempdir.STATVFS_SECONDS:g} s)", *evidence)
    room = f"{folder.free / GIB:.1f} GiB free of {folder.size / GIB:.1f} GiB"
    evidence.insert(0, f"{folder.describe()}: {room}")
    if folder.free >= TMP_WARN_BYTES:
        return ok(f"{folder.path}: {room}", *evidence)
    finding = fail if folder.free < TMP_FAIL_BYTES else warn
    tmpfs = folder.mount is not None and folder.mount.fstype == "tmpfs"
    return mode_finding(finding, "system.tmp-full",
                        f"{folder.path} has {folder.free / GIB:.2f} GiB free"
                        + (" (a tmpfs: RAM-backed)" if tmpfs else "")
                        + ": pip's wheel downloads and builds, and other temporary files, "
                        "fail with [Errno 28] No space left on device", *evidence,
                        here=f"export TMPDIR={_roomy_folder(ctx)}")


# Unix socket paths must fit sun_path (108 bytes with its NUL). Under the temporary folder,
# Python's multiprocessing (DataLoader workers sharing tensors, resource_sharer) adds
# "/pymp-XXXXXXXX/listener-XXXXXXXX" (32 bytes); Ray (vLLM, verl) adds "/ray/session_<date>_
# <time>_<usec>_<pid>/sockets/plasma_store" (up to 68).
SOCKET_MAX = 107
SUFFIX_MULTIPROCESSING = 32
SUFFIX_RAY = 68


@check("system.tmpdir-sockets", "Temporary folder path for sockets")
def temp_folder_socket_paths(ctx: Context):
    folder = tempdir.temp_folder(ctx)
    if folder is None:
        return skip("no temporary folder exists (TMPDIR, TEMP, TMP, /tmp, /var/tmp)")
    length = len(folder.path.encode())
    evidence = [f"{folder.path} ({folder.source}): {length} bytes; sockets under it get "
                f"{SUFFIX_MULTIPROCESSING} (multiprocessing) to {SUFFIX_RAY} (Ray) more, "
                f"of {SOCKET_MAX}"]
    if length + SUFFIX_RAY <= SOCKET_MAX:
        return ok(f"{folder.path} ({length} bytes) leaves room for socket paths", *evidence)
    finding = fail if length + SUFFIX_MULTIPROCESSING > SOCKET_MAX else warn
    who = ("Python multiprocessing (DataLoader workers), Ray and ZMQ" if finding is fail
           else "Ray (vLLM, verl) and ZMQ ipc:// endpoints")
    return mode_finding(finding, "system.tmpdir-socket-path-too-long",
                        f"{folder.path} is {length} bytes: {who} cannot create their Unix "
                        "sockets under it (AF_UNIX path too long)", *evidence,
                        here="export TMPDIR=/tmp/$USER (or another short path) in the job")


def _roomy_folder(ctx: Context) -> str:
    """A folder on a file system with room for temporary files: the node's usual places (read
    with the same deadline: a home on a hung file server cannot stall the check)."""
    home = ctx.env.get("HOME") or os.path.expanduser("~")
    user = ctx.env.get("USER") or "user"
    for candidate in (f"/var/tmp/{user}", f"{home}/tmp"):
        where = mounts.nearest_existing(ctx.path(candidate), ctx)
        if where is not None and (tempdir.room(ctx, str(where))[0] or 0) >= TMP_WARN_BYTES:
            return candidate
    return "<a folder on a disk with several GiB free>"


@check("system.noexec", "Build and cache folders allow exec")
def noexec_folders(ctx: Context):
    """Triton, Inductor and torch's JIT write shared objects and dlopen them; on a noexec
    mount that fails with 'failed to map segment from shared object'."""
    if not mounts.mount_table(ctx):
        return skip("the mount table (/proc/self/mountinfo, /proc/mounts) could not be read")
    blocked, evidence = [], []
    for folder in cachefs.shared_object_folders(ctx.env):
        where = mounts.nearest_existing(folder.path, ctx) or folder.path
        mount = mounts.mount_for(ctx, where)
        if mount is None:
            continue
        evidence.append(f"{folder.describe()}: on {mount.point} ({mount.kind})"
                        + (", noexec" if "noexec" in mount.options else ""))
        if "noexec" in mount.options:
            blocked.append((folder, mount))
    if not evidence:
        return skip("no mount in the mount table holds the cache folders")
    if not blocked:
        return ok("tmp, Inductor, Triton and extensions folders: no noexec mount",
                  *evidence)
    names = ", ".join(f"{f.role} ({f.path} on {m.point})" for f, m in blocked)
    elsewhere = _exec_folder(ctx)
    here = " ".join(f"{f.variable}={elsewhere}/{f.variable.lower()}" for f, _ in blocked)
    return mode_finding(fail if ctx.is_compute else warn, "system.tmp-noexec",
                        f"{names}: mounted noexec, so the shared objects Triton, Inductor or "
                        "torch's JIT build there cannot be loaded", *evidence,
                        here=f"export {here}")


# What a search path's folder that gave no answer means here and for the job (one entry for
# each of dsenv.facts.node.SEARCH_PATHS).
UNANSWERED_MEANS = {
    "PATH": "the commands there were not looked up (other checks may call them missing), and "
            "the job's shell hangs looking a command up there too",
    "LD_LIBRARY_PATH": "the libraries there were not read (other checks may call them "
                       "missing), and the job's dynamic loader hangs loading one from there too",
}


@check("system.path", "PATH and LD_LIBRARY_PATH answer")
def path_folders(ctx: Context):
    """A command or a library is found by a stat in each folder of PATH or LD_LIBRARY_PATH,
    in dsenv as in the job: a folder on a file server that stopped answering (a module's
    /apps/.../bin or lib64 on NFS, a Lustre storage target down) blocks it in the kernel."""
    listed = {var: [f for f in dict.fromkeys(ctx.env.get(var, "").split(os.pathsep)) if f]
              for var in SEARCH_PATHS}
    count = sum(len(folders) for folders in listed.values())
    if not count:
        return skip("PATH and LD_LIBRARY_PATH are empty: nothing is looked up on them")
    shared = {var: [f for f in folders if mounts.may_hang(ctx, f)]
              for var, folders in listed.items()}
    if not any(shared.values()):
        # No count in the summary: it differs with every shell, and README quotes this line.
        return skip("every PATH and LD_LIBRARY_PATH folder is on a local file system: "
                    "a lookup there cannot wait on a file server")
    hung_folders = {var: unanswered_folders(ctx, var) for var in SEARCH_PATHS}
    evidence = [f"{var} {f}: on {mounts.mount_for(ctx, f).describe()}"
                + (", gave no answer" if f in hung_folders[var] else ", answered")
                for var, folders in shared.items() for f in folders]
    if not any(hung_folders.values()):
        return ok(f"{len(evidence)} of {count} PATH and LD_LIBRARY_PATH folders on network or "
                  "FUSE file systems, each answered a stat of its entries", *evidence)
    named = [(f"{var} folder {', '.join(folders)}", UNANSWERED_MEANS[var])
             for var, folders in hung_folders.items() if folders]
    return mode_finding(
        fail if ctx.is_compute else warn, "system.file-server-not-answering",
        " and ".join(what for what, _ in named) + " gave no answer to a stat of its entries: "
        "its file system, or one of its storage targets, stopped answering. "
        + "; ".join(means[0].upper() + means[1:] for _, means in named), *evidence,
        here="meanwhile take the folder off the path (`module unload` the module that added "
             "it) or run where that file system answers")


def _exec_folder(ctx: Context) -> str:
    """A folder this job can use whose mount allows exec: the first of the node's usual
    places for one."""
    home = ctx.env.get("HOME") or os.path.expanduser("~")
    user = ctx.env.get("USER") or "user"
    for candidate in (f"/var/tmp/{user}", f"/dev/shm/{user}", f"{home}/.cache"):
        mount = mounts.mount_for(ctx, mounts.nearest_existing(Path(candidate), ctx) or candidate)
        if mount is not None and "noexec" not in mount.options:
            return candidate
    return "<a folder on a mount without noexec>"


def rdma_devices(ctx: Context) -> list[str]:
    folder = ctx.path("/sys/class/infiniband")
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@check("system.memlock", "Locked-memory limit")
def memlock(ctx: Context):
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 10} KiB"
    if soft == resource.RLIM_INFINITY:
        return ok("ulimit -l is unlimited")
    devices = rdma_devices(ctx)
    if not devices:
        return info(f"ulimit -l is {shown}; no RDMA devices here, so it does not matter")
    return mode_finding(
        fail if ctx.is_compute else warn, "comm.memlock-low",
        f"ulimit -l is {shown} with RDMA devices present: NCCL cannot register memory for "
        "InfiniBand/RoCE and falls back to sockets or fails", "RDMA devices: " + ", ".join(devices),
        here="ask the admins for `* - memlock unlimited` in /etc/security/limits.conf and "
        "PropagateResourceLimitsExcept=MEMLOCK in slurm.conf; in a batch script `ulimit -l "
        "unlimited`")


# The soft open-file limit many distributions and containers start jobs with; DataLoader
# workers that pass tensors as file descriptors run out of it (system.too-many-open-files:
# pytorch#11201, datasets#6877); below it something lowered the limit on purpose.
DEFAULT_NOFILE = 1024
ROOMY_NOFILE = 4096


@check("system.open-files", "Open-file limit (ulimit -n)")
def open_files(ctx: Context):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown = {resource.RLIM_INFINITY: "unlimited"}
    limits = f"ulimit -n is {shown.get(soft, soft)} (hard limit {shown.get(hard, hard)})"
    if soft == resource.RLIM_INFINITY or soft >= ROOMY_NOFILE:
        return ok(limits)
    raise_it = ("`ulimit -n $(ulimit -Hn)` in the job script" if hard != soft else
                "the hard limit is as low: ask the admins (limits.conf nofile, Slurm's "
                "PropagateResourceLimits)")
    if soft < DEFAULT_NOFILE:
        return mode_finding(fail if ctx.is_compute else warn, "system.too-many-open-files",
                            f"{limits}: below the usual {DEFAULT_NOFILE}, DataLoader workers and "
                            "dataset shards run out of file descriptors", here=raise_it)
    # the common default: a fact, and the cause itself when a job's log says it ran out
    return mode_fact("system.too-many-open-files", f"{limits}: the common default, which "
                     "DataLoader workers passing many tensors can run out of", here=raise_it)


@check("system.slurm", "Slurm allocation")
def slurm(ctx: Context):
    alloc = host.slurm_allocation(ctx)
    if not alloc.inside:
        if ctx.is_compute and ctx.options.launcher == "srun":
            return warn("no Slurm allocation (SLURM_JOB_ID unset) but the launcher is srun",
                        "run inside `salloc`/`sbatch`, or choose --launcher mpirun/torchrun")
        return info("not inside a Slurm allocation")
    keys = ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
            "SLURM_GPUS_ON_NODE", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS",
            "SLURM_JOB_PARTITION")
    evidence = [show_variable(k, alloc.variables[k]) for k in keys if k in alloc.variables]
    nodes = alloc.integer("SLURM_JOB_NUM_NODES") or alloc.integer("SLURM_NNODES")
    tasks = alloc.integer("SLURM_NTASKS")
    summary = f"job {alloc.job_id}: {nodes or '?'} node(s), {tasks or '?'} task(s)"
    if not slurm_gpu_variables(alloc.variables):
        summary += ", no GPUs allocated"  # a CPU partition, or a job that asked for none
    o = ctx.options
    if o.nodes and nodes and o.nodes != nodes:
        return warn(f"{summary}, but --nodes {o.nodes} was planned",
                    f"allocate {o.nodes} nodes (`#SBATCH --nodes={o.nodes}`) or plan for {nodes}",
                    *evidence)
    # --gpus-per-node 0 is a CPU job: how many ranks srun starts per node is its own choice.
    if o.launcher == "srun" and o.nodes and o.gpus_per_node and tasks:
        planned = o.nodes * o.gpus_per_node
        if planned != tasks:
            return warn(f"{summary}, but {planned} ranks are planned (one per GPU)",
                        f"`#SBATCH --ntasks-per-node={o.gpus_per_node}` so srun starts {planned} ranks",
                        *evidence)
    per_task = alloc.integer("SLURM_CPUS_PER_TASK")
    if per_task and per_task > 1 and "SRUN_CPUS_PER_TASK" not in ctx.env \
            and "SLURM_STEP_ID" not in ctx.env and o.launcher in (None, "srun"):
        # the batch step: a step srun starts from here gets 1 CPU per task (Slurm >= 22.05)
        return mode_finding(warn, "job.srun-cpus-per-task-dropped",
                            f"{summary}, --cpus-per-task={per_task} but SRUN_CPUS_PER_TASK is "
                            "unset: srun (Slurm 22.05 and later) gives each rank one CPU",
                            *evidence, here=f"export SRUN_CPUS_PER_TASK={per_task}")
    return ok(summary, *evidence)


@check("system.container", "Container runtime")
def container(ctx: Context):
    found = host.container_runtime(ctx)
    if found is None:
        return info("not inside a container")
    name, evidence = found
    if "apptainer" in name.lower() or "singularity" in name.lower():
        gpus = [d for d in ("/dev/nvidia0", "/dev/kfd") if ctx.path(d).exists()]
        libs = ctx.path("/.singularity.d/libs")
        bound = libs.is_dir() and any(libs.iterdir())
        if gpus and not bound:  # the host's GPUs are there, its driver libraries are not
            flag = "--rocm" if gpus[0] == "/dev/kfd" else "--nv"
            return mode_finding(warn, "container.apptainer-no-nv",
                                f"inside a {name} container started without {flag}: {gpus[0]} "
                                "is here but no driver library was bound (/.singularity.d/libs "
                                "is empty): training runs on the CPU", evidence,
                                here=f"`apptainer exec {flag} IMAGE ...` (the flag before the image)")
    return info(f"inside a {name} container", evidence)
