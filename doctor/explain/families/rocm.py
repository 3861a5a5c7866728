"""AMD GPUs (ROCm, HIP, the HSA runtime, MIOpen) read by structure.

ROCm reports the same few failures in many wordings: a GPU target the build has no code
object for (HIP's "invalid device function", hipErrorNoBinaryForGpu, "Unable to find code
object for all current devices", HSA_STATUS_ERROR_INVALID_ISA), the KFD device that cannot be
opened (rocminfo's "Unable to open /dev/kfd read-write: <errno text>", an strace's openat ...
= -1 EACCES, a program's "open /dev/kfd: permission denied"), the HSA runtime's
OUT_OF_RESOURCES that hides the errno, and MIOpen's SQLite databases. Each is read into its
parts (the error kind, the gfx target, the errno, the database file and SQLite's reason) and
the parts name the cause. Below the KFD sit the node's own reasons for having no GPU (the KFD
skipping a GPU without PCIe atomics, no amdgpu module, WSL2 where only AMD's WSL stack works);
around the build and the loader, the libraries' own words (clang without device libraries,
DeepSpeed without a ROCm version file, glibc refusing an executable-stack HIP library, host
libraries that apptainer --rocm bound over the image's).
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "rocm"
IC = re.IGNORECASE

# A kernel launched for a GPU whose gfx target the binary has no code object for.
# HIP prints hipErrorNoBinaryForGpu as "no kernel image is available for execution on the
# device" (CUDA's words for the same error) and hipErrorInvalidImage as "device kernel image is
# invalid": with "HIP error:" before them, or the enum name, they are ROCm's (ggml, in llama.cpp
# and ollama, prints "ROCm error: <HIP's text>").
NO_CODE_OBJECT = re.compile(
    r"HIP error: invalid device function|ROCm error: (?:\S+:\d+: )?invalid device function"
    r"|hipErrorInvalidDeviceFunction|hipErrorNoBinaryForGpu"
    r"|Unable to find code object for all current devices|Cou?l?dn.t find binary for current "
    r"devices|HSA_STATUS_ERROR_INVALID_ISA|HIP error: no kernel image is available for "
    r"execution on the device|HIP error: device kernel image is invalid|hipErrorInvalidImage"
    # HIP's own log line for it (hip_fatbin.cpp, AMD_LOG_LEVEL >= 1), naming the GPU's target
    r"|No compatible code objects (?:found for: |with HIP_FORCE_SPIRV_CODEOBJECT: \d+\. "
    r"Rebuild the application with option --offload-arch=)(?P<gfx>gfx[0-9a-f]{3,4}[\w:+-]*)", IC)
# rocBLAS's form: no Tensile library for the GPU's arch where rocBLAS looks (the errno text
# varies: ENOENT, or ESPIPE "Illegal seek" from the merged library; releases before ROCm 6 do
# not name the arch), or hipBLASLt/rocBLAS's lazy-loading form naming the per-arch file it
# could not load.
TENSILE = re.compile(r"Cannot read [^\n]*?TensileLibrary\S*?:? (?:No such file or directory|Illegal "
                     r"seek)(?: for GPU arch ?: ?(?P<gfx>gfx\w+))?"
                     r"|Could not load [^\n]*?TensileLibrary_lazy_(?P<lazy>gfx\w+)\.dat", IC)
# rocBLAS (ROCm >= 6) lists the Tensile files its library folder holds after that error: files
# for other targets and none for the GPU's is a build without the target (AMDMIGraphX#3517); an
# empty list, a folder it cannot open (vladmandic/sdnext#4737) or its own warning that no path
# matched (justxi/rocm#182) is a library whose files are not where rocBLAS looks.
TENSILE_LIST = re.compile(r"List of available TensileLibrary Files :(?P<files>(?:\s*\"[^\"\n]*\")*)", IC)
LISTED_ARCH = re.compile(r"TensileLibrary_(?:lazy_)?(gfx\w+?)\.dat", IC)
TENSILE_NOT_THERE = re.compile(
    r"directory iterator cannot open directory: No such file or directory \[[^\]\n]*"
    r"|No paths matched [^\n]*?Make sure that ROCBLAS_TENSILE_LIBPATH is set correctly", IC)
# The file named bare, without a folder: the library path was empty (a bundle or wheel without
# the hipBLASLt/rocBLAS library, Windows builds that looked in the working directory: TheRock#580)
TENSILE_BARE = re.compile(r"Cannot read \"?TensileLibrary\w*\.dat\"?:", IC)
GFX = re.compile(r"\bgfx(?P<target>[0-9a-f]{3,4})\b(?P<features>(?::[\w+-]+)*)", IC)
OVERRIDE = re.compile(r"HSA_OVERRIDE_GFX_VERSION=?(?P<value>[0-9.]*)", IC)

# The KFD device node and the errno its open() returned, in the forms rocminfo, strace and
# programs print it.
KFD_OPEN = re.compile(
    r"(?:Unable to open|open(?:at\(AT_FDCWD, \")?)\s*\"?/dev/kfd\"?(?: read-write)?"
    r"(?:[^:\n]*?= -1 (?P<code>E[A-Z]+)|: (?P<text>[^\n]+))", IC)
ERRNO = (("permission", re.compile(r"EACCES|EPERM|Permission denied|Operation not permitted",
                                   IC)),
         ("unsupported", re.compile(r"ENOMEM|Cannot allocate memory", IC)),
         ("missing", re.compile(r"ENOENT|No such file or directory", IC)))
NOT_MEMBER = re.compile(r"(?P<user>\S+) is not member of \"?(?P<group>render|video)\"? group", IC)
# rocminfo's (or any tool's) hsa_init failing: "hsa api call failure ... Call returned ...".
OUT_OF_RESOURCES = re.compile(r"(?:Call returned|hsa_init\S*\s*(?:failed|returned)\S*)\s*"
                              r"HSA_STATUS_ERROR_OUT_OF_RESOURCES", IC)
KFD_UNSUPPORTED = re.compile(r"(?P<chip>\w+)\s+not supported in kfd|kfd not supported on "
                             r"this ASIC", IC)
# The KFD skipped a GPU whose PCIe path has no atomics (dmesg); rocminfo then fails with
# OUT_OF_RESOURCES (4104) like for an unsupported GPU, but the atomics line says why.
ATOMICS = re.compile(r"skipped device (?P<device>[0-9a-f]{4}:[0-9a-f]{4}), PCI rejects atomics", IC)
# No GPU for HIP at all, in the words of torch, HIP, rocminfo and rocm-smi (hipErrorNoDevice's
# own text, hipGetErrorString's "no ROCm-capable device is detected", is what llama.cpp/ggml and
# hipInfo print).
NO_GPU = re.compile(r"No HIP GPUs are available|hipErrorNoDevice|no ROCm-capable device is detected"
                    r"|ROCk module is NOT (?:loaded|live)"
                    r"|driver not initialized \(amdgpu not found in modules\)", IC)
# WSL2's kernel (collect_env's platform line, uname) or the user saying so: there is no KFD
# there, and only AMD's WSL stack reaches the GPU.
WSL = re.compile(r"microsoft-standard-WSL2?|\bWSL ?2\b|\bon WSL\b|WSL environment detected", IC)

# WSL's ROCm runtime (libhsakmt's dxg thunk) found no Windows GPU adapter it can drive.
NO_WDDM = re.compile(r"No WDDM adapters found", IC)
# rocminfo's and rocm-smi's/amd-smi's words for a node whose amdgpu module (and KFD) is not
# loaded; "built into the kernel" is the one case where the check itself is wrong.
NO_DRIVER = re.compile(r"ROCk module is NOT (?:loaded|live)|driver not initialized \(amdgpu not found "
                       r"in modules\)|/sys/module/amdgpu/initstate: No such file", IC)
BUILT_IN = re.compile(r"built (?:directly )?into the kernel|CONFIG_DRM_AMDGPU=y", IC)
# DeepSpeed's op_builder reading the ROCm version from the install's .info folder.
DS_ROCM_VERSION = re.compile(r"No such file or directory: '(?P<file>[^'\n]*/\.info/version(?:-dev)?)'"
                             r"|AssertionError: Could not detect ROCm version", IC)
# apptainer --rocm's bind folder holding one of the host's ROCm (or ROCm-dependency) libraries.
SINGULARITY_LIB = re.compile(r"/\.singularity\.d/libs/(?P<lib>rocblas|rocfft|hipblaslt|lib(?:hsa-runtime64"
                             r"|amdhip64|rocblas|rocfft|rocsolver|hipblas|MIOpen|hiprtc|amd_comgr"
                             r"|drm_amdgpu|drm|numa|elf)\b[\w.]*)", IC)

# glibc 2.41+ refusing a ROCm library whose GNU_STACK header asks for an executable stack.
EXECSTACK = re.compile(r"(?P<lib>lib(?:amdhip64|hiprtc|rccl|hsa-runtime64|MIOpen|rocblas|amd_comgr)"
                       r"[\w.-]*): cannot enable executable stack", IC)

# clang's AMDGPU toolchain without the amdgcn bitcode libraries at its ROCm path.
DEVICE_LIBS = re.compile(r"cannot find ROCm (?:device library[.;] ?[Pp]rovide|installation\.\s+Provide)"
                         r" its path via", IC)

# clang's HIP driver without the HIP runtime (include/hip, libamdhip64) where HIP_PATH, --rocm-path
# or its own install path says ROCm is: an unset or stale HIP_PATH, or no HIP development package.
HIP_RUNTIME = re.compile(r"clang[\w+.-]*: error: cannot find HIP runtime\b|cannot find HIP runtime[.;] ?"
                         r"[Pp]rovide its path via", IC)
# dkms taking a leftover /var/lib/dkms/<module>/<old version> folder (no dkms.conf left in it)
# for a source tree: every dkms command, and so amdgpu-dkms's install, stops there.
DKMS_STALE = re.compile(r"Could not locate dkms\.conf file\.?\s*File:\s*(?P<tree>/var/lib/dkms/"
                        r"(?P<module>[\w.-]+)/(?P<version>[^/\s]+))/source/dkms\.conf does not exist",
                        IC)

# WSL's runtime (librocdxg) refusing a GPU that ROCm on WSL does not support.
WSL_UNSUPPORTED = re.compile(r"ROCR: unsupported GPU", IC)
# GPUs ROCm on WSL never supported (RDNA2 and older): no GPU under WSL then is the GPU itself.
OLD_RADEON = re.compile(r"\bRX ?[56]\d{2,3}\b|\bgfx10[13]\d\b|\bgfx[89]0\w\b|Radeon VII", IC)
HSA_INIT_FAILED = re.compile(r"hsa_init Failed|HSA_STATUS_ERROR_OUT_OF_RESOURCES", IC)

# A ROCm extension's setup.py (flash-attn's CK backend, aiter) rejecting a target not in its
# allow-list of gfx archs.
ARCH_LIST = re.compile(r"One of GPU archs of \[(?P<archs>[^\]\n]*)\] is invalid or not supported"
                       r"|(?P<gfx>gfx\w+)\s+is invalid or not supported by Flash-Attention"
                       # the same allow-list checked at run time (csrc's TORCH_CHECK on the gfx)
                       r"|(?P<runtime>FlashAttention only supports AMD MI200 GPUs or newer)", IC)

# The perl hipcc/hipconfig exec'ing a compiler under the ROCm path they assumed (ROCM_PATH,
# HIP_CLANG_PATH, HCC_HOME default to /opt/rocm) where there is none.
HIP_EXEC = re.compile(r"Can't exec \"(?P<tool>[^\"\n]*/(?:clang(?:\+\+)?|llc|hcc|hcc-config))\": No such "
                      r"file or directory at (?P<script>\S*\bhip(?:cc|config))\b", IC)

# Ray (>= 2.45) and verl refusing ROCR_VISIBLE_DEVICES beside, or HIP/CUDA_VISIBLE_DEVICES that
# disagree with, the variable they select AMD GPUs by.
VISIBLE = re.compile(r"Please use HIP_VISIBLE_DEVICES instead of ROCR_VISIBLE_DEVICES"
                     r"|Inconsistant values found\. Please use either HIP_VISIBLE_DEVICES or "
                     r"CUDA_VISIBLE_DEVICES|Please use the same HIP_VISIBLE_DEVICES or "
                     r"CUDA_VISIBLE_DEVICES, inconsistant values found|Please don't set "
                     r"ROCR_VISIBLE_DEVICES when HIP/CUDA_VISIBLE_DEVICES is set", IC)

# Docker could not pass /dev/kfd: the host itself has none.
DOCKER_NO_KFD = re.compile(r"adding custom device \"?(?P<device>/dev/kfd|/dev/dri\S*?)\"?: "
                           r"no such file or directory", IC)

# MIOpen's databases: the file (or the source line of its SQLite wrapper) and SQLite's reason.
MIOPEN_DB = re.compile(
    r"(?:sqlite_db\.cpp|kern_db\.hpp|SQLite database|find-db|File is unreadable"
    r"|Db lock has failed)[^\n]*", IC)
MIOPEN_PATH = re.compile(r"(?P<path>/\S*(?:miopen|MIOpen)\S*?\.(?:u?k?db|ufdb\.txt|u?pdb"
                         r"\.txt|udb))\b|\[(?P<dir>/\S*miopen\S*)\]", IC)
SQLITE_REASON = re.compile(
    r"database disk image is malformed|disk I/O error|locking protocol|database is locked"
    r"|unable to open database file|attempt to write a readonly database|File is unreadable"
    r"|Failed to store record|Db lock has failed to lock", IC)
MIOPEN_DIR_DENIED = re.compile(r"MIOpen Error: filesystem error: cannot create directories: "
                               r"Permission denied \[(?P<dir>[^\]]+)\]", IC)

# libdrm's device-name table and MIOpen's precompiled kernels: their absence is only a warning.
AMDGPU_IDS = re.compile(r"amdgpu\.ids: No such file or directory", IC)
SYSTEM_DB = re.compile(r"\[SQLiteBase\] (?:Unable to read|Missing) system database file:? ?"
                       r"(?P<file>\S+?) Performance may degrade", IC)


def _errno(match: re.Match) -> tuple[str, str]:
    said = match["code"] or match["text"] or ""
    return next(((kind, said.strip()) for kind, pattern in ERRNO if pattern.search(said)),
                ("", said.strip()))


def _tensile(message: str, around: str) -> Reading | None:
    """rocBLAS's Tensile files, read with the list of files it printed (in the lines around):
    files-missing when the folder is empty or missing; None otherwise (a list of other targets'
    files is the code-object reading below)."""
    error = TENSILE.search(message)
    if not error:
        return None
    text = f"{message}\n{around}"
    listing = TENSILE_LIST.search(text)
    missing = TENSILE_NOT_THERE.search(text) or TENSILE_BARE.search(text)
    # an empty list is one rocBLAS went on from (a paste cut after the header says nothing)
    empty = listing and not LISTED_ARCH.search(listing["files"]) and text[listing.end():].strip()
    if missing or empty:
        return reading(FAMILY, "rocm.rocblas-tensile-files-missing", error.group(0),
                       error=error.group(0), gfx=error["gfx"] or "",
                       library=(missing.group(0) if missing else "no files listed")[:160])
    return None


def _lists_own_target(message: str, around: str) -> bool:
    """rocBLAS named the GPU's target and listed a file for it: the files are there, so the
    failure to read them is not a build without the target."""
    error, listing = TENSILE.search(message), TENSILE_LIST.search(f"{message}\n{around}")
    return bool(error and error["gfx"] and listing and error["gfx"].lower() in
                {a.lower() for a in LISTED_ARCH.findall(listing["files"])})


# Ollama's warning that its ROCm libraries carry no code for the GPU's gfx (it then runs on
# the CPU): "amdgpu [0] gfx1103 is not supported by <dir> [gfx1030 ...]" (older) and
# "amdgpu is not supported (supported types:[gfx1030 ...])" ... gpu_type=gfx1031 (newer); an
# empty list is another cause (Windows without the rocBLAS files) and does not match.
OLLAMA_UNSUPPORTED = re.compile(
    r"amdgpu (?:\[\d+\] (?P<gfx>gfx\w+) )?is not supported (?:by \S+ \[(?P<list>gfx[\w ]+)\]"
    r"|\(supported types:\[(?P<types>gfx[\w ]+)\]\)\S*(?:[^\n]*?gpu_type=(?P<gpu_type>gfx\w+))?)")
# clang refusing a gfx target it does not know: the compiler predates that GPU ("native" is a
# clang without offload-arch detection, another cause, and does not match)
CLANG_TARGET = re.compile(r"(?P<clang>clang(?:\+\+)?(?:-\d+)?): error: invalid target ID "
                          r"'(?P<gfx>gfx[0-9a-f]{3,4})'")


def read(message: str, around: str = "") -> list[Reading]:
    if not message:
        return []
    found: list[Reading] = []
    # Recent releases raise "Configured ROCm binary not found at ..."; earlier ROCm builds warned
    # "Could not find the bitsandbytes ROCm binary at PosixPath(...)", the CUDA builds' warning
    # worded for the backend, and fell back to the CPU library
    bnb = re.search(r"(?:Configured ROCm binary not found at|Could not find the bitsandbytes ROCm "
                    r"binary at)\s+\S*?libbitsandbytes_rocm(?P<tag>\d+)\.(?:so|dll)", message)
    if bnb:  # the library bitsandbytes asks for is named after torch's HIP, not its build's
        found.append(reading(FAMILY, "rocm.bnb-binary-version-tag", bnb.group(0)[:160],
                             asked_for=f"libbitsandbytes_rocm{bnb['tag']}"))
    if ollama := OLLAMA_UNSUPPORTED.search(message):
        found.append(reading(FAMILY, "gpu.rocm-gfx-unsupported", ollama.group(0)[:160],
                             gfx=ollama["gfx"] or ollama["gpu_type"] or "",
                             built_for=(ollama["list"] or ollama["types"]).strip(),
                             program="Ollama"))
    if clang := CLANG_TARGET.search(message):
        found.append(reading(FAMILY, "rocm.compiler-lacks-gfx-target", clang.group(0),
                             compiler=clang["clang"], gfx=clang["gfx"]))
    files = _tensile(message, around)
    if files:
        found.append(files)
    # a Tensile file under apptainer's bind folder is the host's rocBLAS shadowing the image's
    # (rocm.apptainer-rocm-binds-host-libs, read below), not a build without the target
    code = NO_CODE_OBJECT.search(message) or (
        not files and not _lists_own_target(message, around)
        and not SINGULARITY_LIB.search(message) and TENSILE.search(message))
    # An APU's iGPU beside a discrete GPU (in the line or the lines around) makes it
    # rocm.igpu-selected instead: that evidence has one home, the mode's `also`, which is also
    # gpu.rocm-gfx-unsupported's `against` (rank.py weighs both).
    if code:  # the build has no kernels for this GPU's target
        named = code.groupdict().get("gfx") or code.groupdict().get("lazy")
        gfx = GFX.search(message)
        override = OVERRIDE.search(message)
        listing = TENSILE_LIST.search(f"{message}\n{around}")
        found.append(reading(FAMILY, "gpu.rocm-gfx-unsupported", code.group(0), error=code.group(0),
                             gfx=named or (f"gfx{gfx['target']}{gfx['features']}" if gfx else ""),
                             override=override["value"] if override else "",
                             library_has=", ".join(sorted(set(LISTED_ARCH.findall(
                                 listing["files"])))) if listing else ""))
    kfd = KFD_OPEN.search(message)
    kind, said = _errno(kfd) if kfd else ("", "")
    member = NOT_MEMBER.search(message)
    atomics = ATOMICS.search(message)
    nogpu = NO_GPU.search(message)
    wsl = WSL.search(message) if nogpu else None
    refused = WSL_UNSUPPORTED.search(message)
    old = OLD_RADEON.search(message)
    if not refused and old and WSL.search(message) and (nogpu or HSA_INIT_FAILED.search(message)):
        refused = nogpu or HSA_INIT_FAILED.search(message)
    if refused:  # WSL's runtime does not drive this GPU (RDNA2 and older, unlisted SKUs)
        found.append(reading(FAMILY, "rocm.wsl-gpu-unsupported", refused.group(0),
                             error=refused.group(0), gpu=old.group(0) if old else ""))
    elif atomics:  # the KFD skipped the GPU: the rocminfo failure beside it is this
        found.append(reading(FAMILY, "rocm.pcie-atomics-missing", atomics.group(0),
                             device=atomics["device"]))
    elif wsl or NO_WDDM.search(message):  # no GPU under WSL2: only AMD's WSL stack works there
        error = (nogpu or NO_WDDM.search(message)).group(0)
        found.append(reading(FAMILY, "rocm.wsl-needs-radeon-wheel", error, error=error,
                             platform=wsl.group(0) if wsl else "WSL (WDDM)"))
    elif NO_DRIVER.search(message) and not BUILT_IN.search(message):
        # the node's amdgpu module is not loaded (a VM, a kernel amdgpu-dkms did not build for)
        driver = NO_DRIVER.search(message)
        found.append(reading(FAMILY, "rocm.amdgpu-driver-not-loaded", driver.group(0),
                             error=driver.group(0)))
    elif kind == "permission" or member:
        # EACCES/EPERM on /dev/kfd, or rocminfo saying the user lacks the group: permissions
        found.append(reading(FAMILY, "rocm.kfd-permission-denied", (kfd or member).group(0),
                             device="/dev/kfd", errno=said,
                             group=member["group"] if member else ""))
    elif kind == "unsupported" or KFD_UNSUPPORTED.search(message):
        # The KFD answers ENOMEM for a GPU it does not drive (dmesg: not supported in kfd).
        chip = KFD_UNSUPPORTED.search(message)
        found.append(reading(FAMILY, "rocm.gpu-not-supported-by-kfd", (kfd or chip).group(0),
                             device="/dev/kfd", errno=said,
                             chip=(chip["chip"] or "") if chip else ""))
    elif not kind and OUT_OF_RESOURCES.search(message):
        # hsa_init's OUT_OF_RESOURCES with no permission evidence: the KFD refused the GPU
        found.append(reading(FAMILY, "rocm.gpu-not-supported-by-kfd",
                             OUT_OF_RESOURCES.search(message).group(0),
                             status="HSA_STATUS_ERROR_OUT_OF_RESOURCES"))
    # ENOENT on /dev/kfd with the driver loaded is a container without the device: the
    # container family reads it.
    archs = ARCH_LIST.search(message)
    if archs:  # the extension's setup allows only the gfx targets it lists
        found.append(reading(FAMILY, "rocm.flash-attn-arch-list", archs.group(0),
                             archs=archs["archs"] or archs["gfx"] or "gfx90x, gfx94x (MI200, MI300)"))
    hip_exec = HIP_EXEC.search(message)
    if hip_exec:  # hipcc/hipconfig assumed a ROCm path the install is not at
        found.append(reading(FAMILY, "rocm.hip-env-not-loaded", hip_exec.group(0),
                             looked_for=hip_exec["tool"], by=hip_exec["script"]))
    visible = VISIBLE.search(message)
    if visible:  # Ray/verl select AMD GPUs by HIP_VISIBLE_DEVICES alone
        found.append(reading(FAMILY, "rocm.visible-devices-conflict", visible.group(0),
                             refused=visible.group(0)))
    docker = DOCKER_NO_KFD.search(message)
    if docker:  # the Docker host has no such device node to pass
        found.append(reading(FAMILY, "rocm.kfd-device-missing", docker.group(0),
                             device=docker["device"]))
    execstack = EXECSTACK.search(message)
    if execstack:  # the library is fine; the newer glibc will not grant its stack flag
        found.append(reading(FAMILY, "rocm.hip-lib-execstack", execstack.group(0),
                             library=execstack["lib"]))
    devlibs = DEVICE_LIBS.search(message)
    if devlibs:  # the compile found no device libraries where ROCM_PATH says ROCm is
        found.append(reading(FAMILY, "rocm.device-libs-not-found", devlibs.group(0)))
    runtime = HIP_RUNTIME.search(message)
    if runtime:  # the compile found no HIP runtime where HIP_PATH/--rocm-path says ROCm is
        found.append(reading(FAMILY, "rocm.hip-runtime-not-found", runtime.group(0)))
    stale = DKMS_STALE.search(message)
    if stale:  # a left-over module version folder stops dkms (and the driver's install)
        found.append(reading(FAMILY, "rocm.dkms-stale-module-tree", stale.group(0),
                             folder=stale["tree"], module=stale["module"],
                             version=stale["version"]))
    ds = DS_ROCM_VERSION.search(message)
    if ds:  # DeepSpeed's setup found no ROCm version file where it looks
        found.append(reading(FAMILY, "rocm.deepspeed-rocm-version-undetected", ds.group(0),
                             version_file=ds["file"] or ""))
    bound = SINGULARITY_LIB.search(message)
    if bound:  # the host's ROCm library, bound in by --rocm, is the one that failed
        found.append(reading(FAMILY, "rocm.apptainer-rocm-binds-host-libs", bound.group(0),
                             library=bound["lib"]))
    denied = MIOPEN_DIR_DENIED.search(message)
    db = MIOPEN_DB.search(message)
    if denied or db:
        # MIOpen's user db / kernel cache cannot be used where it is (shared, read-only, locked)
        path = MIOPEN_PATH.search(message)
        reason = SQLITE_REASON.search(message)
        found.append(reading(FAMILY, "cache.miopen-db-shared-fs", (denied or db).group(0),
                             database=(denied["dir"] if denied else
                                       (path["path"] or path["dir"]) if path else ""),
                             reason="permission denied" if denied else
                             reason.group(0) if reason else ""))
    if not found and AMDGPU_IDS.search(message):
        # Only when nothing else is wrong: the missing name table is never the failure.
        found.append(reading(FAMILY, "rocm.amdgpu-ids-missing-benign",
                             AMDGPU_IDS.search(message).group(0)))
    sysdb = SYSTEM_DB.search(message)
    if not found and sysdb:
        # The same for MIOpen's missing per-gfx kernel database: slower, not failed.
        found.append(reading(FAMILY, "rocm.miopen-system-db-missing-benign", sysdb.group(0),
                             database=sysdb["file"]))
    return found
