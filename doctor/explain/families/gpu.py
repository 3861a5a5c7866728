"""The GPU, its driver and the CUDA runtime, and the torch build, read by structure.

CUDA reports one failure in several forms (the runtime's text, the enum of either API, a number
in a wrapper's frame); each is read into one error kind (cuda_errors.py), and the kind with
what is printed around it (the GPU's sm_XX and the build's arch list, the driver's CUDA version,
a compiled extension in the traceback) names the cause. NVML's, the kernel's (Xid)
and the Fabric Manager's own lines are read the same way; xFormers' build line tells another
torch release, another CUDA and a CPU-only torch apart.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading
from dsenv.doctor.explain.families.build_compile import ext_build_without_gpu
from dsenv.doctor.explain.families.container import NGC_NO_DRIVER
from dsenv.doctor.explain.families.cuda_errors import NO_DRIVER, OWN_KERNEL_ERROR, first_error

FAMILY = "gpu"
IC = re.IGNORECASE

# What says a forward-compat libcuda is on the path: the package, its folder, the words for it.
COMPAT_LIB = re.compile(r"\S*cuda[ -]compat[\w.-]*|\S*/compat/libcuda\S*|\S*/cuda[\w.-]*/compat\b"
                        r"|\bcompat (?:path|librar(?:y|ies)|libs?)\b", IC)
STUB_PATH = re.compile(r"(?:/[\w.+-]+)*/stubs/libcuda\.so\b", IC)


# MIG: a CUDA process enumerates one MIG instance (NVIDIA's MIG user guide), so a second device
# index fails; the evidence is the MIG profile in a device name, the words "MIG instances", a MIG
# UUID given to CUDA_VISIBLE_DEVICES, or nvidia-smi's MIG M. column saying Enabled (the column
# is there on every A100/H100, mostly Disabled). torch's num_gpus assert without it has another
# settled cause (torch counting GPUs before the script changed CUDA_VISIBLE_DEVICES).
MIG = re.compile(r"\bMIG[- ]\d+g\.\d+gb\b|\bMIG (?:GPU )?instances?\b|CUDA_VISIBLE_DEVICES=MIG"
                 r"|MIG M\.[\s\S]*?\|\s*Enabled\s*\|", IC)
NUM_GPUS = re.compile(r"device >= 0 && device < num_gpus INTERNAL ASSERT FAILED(?:[^\n]*?"
                      r"device=(?P<device>\d+), num_gpus=(?P<count>\d+))?", IC)

# torch's own words around a kernel or a driver problem.
# (a pasted log may wrap torch's long line anywhere after the GPU's name)
INCOMPATIBLE = re.compile(r"(?P<gpu>[^\n]*?) with CUDA capability sm_(?P<arch>\d+) is\s+not\s+"
                          r"compatible\s+with\s+the\s+current\s+PyTorch\s+installation", IC)
# Without the build's list, the GPU's arch alone tells: torch wheels that lack an arch below
# Volta (sm_70) are the ones that dropped it (cu128+ builds start at sm_70/sm_75; every older
# wheel carried sm_60/sm_61), so such a GPU is below the build's floor; a newer GPU is above
# the build's top.
FLOOR_DROPPED = 70
SUPPORTS = re.compile(r"PyTorch install supports CUDA capabilities(?P<list>(?:\s+\w+_\d+)+)", IC)
TOO_OLD = re.compile(r"Found GPU\d+ (?P<gpu>[^\n]+?) which is of cuda capability "
                     r"(?P<cc>\d+\.\d+)[\s\S]{0,80}?no longer supports this GPU", IC)
# torch 2.6+: one range instead of the list; only the numbers tell a GPU below the build's
# floor from one above its top (a capability inside the range, or a newer minor of the top
# major, runs: NVIDIA GPUs are binary compatible within a major, pytorch/pytorch#164708).
RANGE = re.compile(r"Found GPU\d+ (?P<gpu>[^\n]+?) which is of cuda capability (?P<cc>\d+\.\d+)"
                   r"\.?\s+Minimum and Maximum cuda capability supported by this version of "
                   r"PyTorch is\s+\((?P<lo>\d+\.\d+)\)\s*-\s*\((?P<hi>\d+\.\d+)\)", IC)
DRIVER_OLD = re.compile(r"NVIDIA driver on your system is too old \(found version (?P<v>\d+)\)", IC)
# Counted no GPU: DeepSpeed's runner on the node that launches (before any rank starts), or
# torch's NCCL process group in a rank (whose words launch.ds-env-not-forwarded shares:
# alternatives.toml no-gpu-seen).
NONE_COUNTED = re.compile(r"Unable to proceed, no GPU resources available|ProcessGroupNCCL is "
                          r"only supported with GPUs, no GPUs found", IC)
NVML_MISMATCH = re.compile(r"Driver/library version mismatch(?:[\s\S]{0,40}?NVML library "
                           r"version: (?P<lib>[\d.]+))?|NVRM: API mismatch: the client", IC)
SMI_NO_DRIVER = re.compile(r"couldn.t communicate with the NVIDIA driver", IC)
XID = re.compile(r"Xid \(PCI:(?P<bus>[^)]*)\): (?P<xid>\d+)", IC)
# NVML's words for the same state (NVML_ERROR_GPU_IS_LOST, 15: the kernel driver marked the GPU
# lost, Xid 79), as nvidia-smi, pynvml and node monitors print them
OFF_BUS = re.compile(r"fallen off the bus|GPU is lost\.\s+Reboot\s+the system|"
                     r"\b(?:NVML_)?ERROR_GPU_IS_LOST\b|NVMLError_GpuIsLost|NV_ERR_GPU_IS_LOST", IC)
# nvidia-smi's own line when NVML has no handle for a GPU it enumerates on PCI (bare metal
# prints the bus id glued to "GPU"): the GPU lost from the bus, as NVML_ERROR_GPU_IS_LOST
SMI_NO_HANDLE = re.compile(r"Unable to determine the device handle for GPU ?(?P<bus>[0-9a-f]{3,8}:"
                           r"[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]): (?:Unknown Error|GPU is lost)", IC)
# The container hook (libnvidia-container < 1.1) calls cuInit on the host before the container
# starts: its "cuda error: X" is the host's driver stack failing, not the container's.
HOOK_CUDA = re.compile(r"nvidia-container-cli(?:\.real)?:? (?:reports \"?)?(?:initialization error: )?"
                       r"cuda error[:\uff0c,] ?(?P<what>unknown error|no cuda-capable device is "
                       r"detected|invalid device ordinal|initialization error)", IC)
# The kernel module loaded but initialised no GPU: the kernel log says why (a GPU only the open
# modules drive, or the GPU's own initialisation failing: BIOS, GSP firmware, hardware).
NO_DEVICES = re.compile(r"\bNo devices were found\b", IC)
OPEN_REQUIRED = re.compile(r"(?:PCI ID: (?P<pci>10de:[0-9a-f]{4})\) )?installed in this system "
                           r"requires use of the NVIDIA open kernel modules", IC)
RM_INIT = re.compile(r"RmInitAdapter failed!(?: \((?P<code>[0-9a-fx:*]+)\))?|rm_init_adapter failed"
                     r"|Cannot initialize GSP firmware RM", IC)
# CUDA reports a missing libcuda as an insufficient driver (35): with the message saying there is
# no NVIDIA GPU or driver where it ran (AMD/Intel graphics, no nvidia-smi, CPU-only, a hosted CI
# runner), that is the cause, not the driver's age
NO_NVIDIA = re.compile(r"\b(?:no|do(?:es)? not have an?|don'?t have an?|haven'?t(?: got)?(?: an?)?|"
                       r"without(?: an?)?)\s+(?:nvidia\s+|cuda[- ]capable\s+|dedicated\s+)?(?:gpus?|"
                       r"graphics card|video card|nvidia card)\b|\b(?:AMD|Intel)\s+(?:gpus?|cards?|"
                       r"graphics|cuda)\b|\[[+x]\]\s*(?:AMD|Intel)\b|nvidia-smi:?\s+(?:command\s+)?"
                       r"not found|'nvidia-smi' is not recognized|\bCPU[- ]only\b|github(?:[- ]hosted)? "
                       r"(?:actions|runners?)|\btravis\b", IC)
# Kernels the GPU is too old for: FlashAttention-2 (sm80+), Triton behind torch.compile (7.0+).
FLASH_AMPERE = re.compile(r"FlashAttention only supports Ampere GPUs or newer", IC)
TRITON_OLD = re.compile(r"Found (?P<gpu>[^\n]+?) which is too old to be supported by the triton "
                        r"GPU compiler[\s\S]{0,200}?capability (?P<cc>\d+\.\d+)", IC)
# cuBLAS refusing a bfloat16 GEMM (CUDA_R_16BF operands): a GPU without bf16 tensor support.
REDUCED = re.compile(r"CUDA_R_(?:16F|16BF|8F\w*)\b")
BF16_GEMM = re.compile(r"CUBLAS_STATUS_NOT_SUPPORTED when calling `?cublas\w+\([^`]*?CUDA_R_16BF", IC)
# cuBLAS/cuDNN refusing the device (cublasStatus_t 8); the GPU's capability where printed near
# it (torch's "cuda capability", Kaldi's device line): 5.0 and above is a data type, not its age
LIB_ARCH = re.compile(r"\b(?:CUBLAS|CUDNN)_STATUS_ARCH_MISMATCH\b|cudnnStatusArchMismatch", IC)
CAPABILITY = re.compile(r"(?:capability|free/total:[\d.]+ version)\s*:?\s*(?P<cc>[1-9]\.\d)\b", IC)
# torch's out-of-memory report: what the GPU has, what is free, what this process holds.
# torch prints a size under 1 KiB as "N bytes" ("0 bytes already allocated")
_SIZE = r"[\d.]+ (?:[KMGT]?i?B|bytes)"
OOM_OLD = re.compile(rf"\(GPU (?P<gpu>\d+); (?P<total>{_SIZE}) total capacity; (?P<alloc>{_SIZE}) "
                     rf"already allocated; (?P<free>{_SIZE}) free; (?P<mine>{_SIZE}) reserved "
                     r"in total by PyTorch\)", IC)
OOM_NEW = re.compile(rf"GPU (?P<gpu>\d+) has a total capacity of (?P<total>{_SIZE}) of which "
                     rf"(?P<free>{_SIZE}) is free\.[\s\S]{{0,600}}?Including non-PyTorch memory, "
                     rf"this process has (?P<mine>{_SIZE}) memory in use", IC)
UNITS = {"B": 1, "BYTES": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 1e3,
         "MB": 1e6, "GB": 1e9, "TB": 1e12}
# The deepspeed runner: CUDA_VISIBLE_DEVICES turned into --include, or a slot it lacks.
DS_INCLUDE = re.compile(r"Detected CUDA_VISIBLE_DEVICES=(?P<visible>\S+): setting "
                        r"--include=(?P<include>\S+)", IC)
# torch built without CUDA or without NCCL; a Windows path says which platform's build it is.
NO_CUDA = re.compile(r"Torch not compiled with CUDA enabled", IC)
NO_NCCL = re.compile(r"Distributed package doesn't have NCCL|NCCL support is not compiled", IC)
WINDOWS = re.compile(r"\b[A-Z]:\\|\.exe\b|\bwindows\b", IC)
# XLA's check of the ptxas it will use against the driver (two wordings across releases); the
# versions may be wrapped across lines in a pasted log.
XLA_PTX = re.compile(r"The NVIDIA driver's CUDA version is (?P<driver>\d+\.\s*\d+) which is older "
                     r"than the (?:ptxas CUDA|PTX compiler) version \(?(?P<ptxas>[\d.]*\d)"
                     r"|Because the driver is older than the (?:ptxas|PTX compiler) version, XLA "
                     r"is disabling parallel compilation", IC)
# The driver's own JIT assembler (cuLinkAddData, cuModuleLoadData: numba, CuPy) refusing PTX of
# a newer ISA than it reads: the "current version" is the driver's (nvcc's own ptxas refusing
# PTX at build time is toolkit.ptxas-older-than-ptx).
DRIVER_PTXAS = re.compile(r"ptxas application ptx input, line \d+; fatal\s*: Unsupported \.version "
                          r"(?P<ptx>\d+\.\d+); current version is '(?P<driver>\d+\.\d+)'", IC)
DRIVER_JIT = re.compile(r"\bcu(?:Link\w+|ModuleLoad\w*)\b", IC)
# Fabric Manager's refusal: its driver interface is another release than the loaded driver
FM_MISMATCH = re.compile(r"fabric manager NVIDIA GPU driver interface version (?P<fm>\S+) (?:don|doesn)"
                         r"[\u2019']t match with driver version (?P<driver>[\d.]*\d)", IC)
NO_SLOT = re.compile(r"No slot '(?P<slot>\d+)' specified on host '?(?P<host>[\w.-]+)", IC)
# Triton's launch check: the kernel's shared memory per block against this GPU's limit
TRITON_SHMEM = re.compile(r"out of resource: shared memory,? ?Required: ?(?P<need>\d+),? ?Hardware "
                          r"limit(?:ation)?: ?(?P<limit>\d+)", IC)
# Lightning's check of the indices asked for against those visible (an empty list: no GPU at all)
LIGHTNING_GPUS = re.compile(r"You requested (?:gpu|GPUs?|cuda): (?P<asked>\[[0-9, ]+\])(?:\s*But "
                            r"your machine only has: (?P<visible>\[[0-9, ]*\]))?", IC)

# Who else may own the same words.
DEEPSPEED = re.compile(r"deepspeed|op_builder|fused_adam|DS_BUILD", IC)
# A compiled extension in the traceback: its build flags, its ops folder, a *_cuda/_ext/_C
# module that is not torch's own, a package known to ship its own CUDA kernels, or its own
# kernels' error words.
EXTENSION = re.compile(r"TORCH_CUDA_ARCH_LIST|cpp_extension|-gencode|ext_module|\b_ext\b|/ops/"
                       r"|\b\w+_cuda\.\w+\(|(?<!torch)\._C\.\w+\(|flash_attn|xformers"
                       r"|\bapex\b|mmcv|detectron2|" + OWN_KERNEL_ERROR.pattern, IC)
# tiny-cuda-nn's own load check: its extension was built for other compute capabilities
TCNN = re.compile(r"Could not find compatible tinycudann extension for compute capability (\d+)")
CONTAINER = re.compile(r"singularity|apptainer|docker|podman|enroot|\.sif\b", IC)
# ... started without the GPU: NVIDIA's images say so at start, or the docker run line shows it
NO_GPU_CONTAINER = re.compile(NGC_NO_DRIVER.pattern + r"|^[^\n]*\bdocker run\b(?![^\n]*(?:--gpus|--runtime[= ]?"
                              r"nvidia|--device[= ]?nvidia))[^\n]*$", re.MULTILINE)
# A kernel without code for the GPU in a binary that is not torch's: HIP's builds (ROCm torch
# and ggml print CUDA's words there too; the rocm family reads them) and ggml's own CUDA build.
# (collect_env's "ROCM used to build PyTorch: N/A" beside a CUDA build is not one of them.)
NOT_TORCH_KERNELS = re.compile(r"\bHIP (?:error|kernel errors)|ROCm error|hipError\w|\+rocm\d"
                               r"|ROCM used to build PyTorch: \d|\bgfx\d{3}|HSA_OVERRIDE_GFX"
                               r"|\bggml|llama\.cpp", IC)
# torch's runtime compiler (NVRTC: the JIT fusers, TorchScript, jiterator) refusing the GPU's
# arch: the CUDA torch was built with predates the GPU (RTX 30xx on cu110, 40xx on cu113).
# CuPy ships its own NVRTC: its refusal is CuPy's CUDA, not torch's.
NVRTC_ARCH = re.compile(r"nvrtc: error: invalid value for --gpu-architecture", IC)
CUPY = re.compile(r"\bcupy", IC)
# A vGPU (GRID) guest driver without a license: nvidia-smi -q's state, the Windows driver's
# notice, nvidia-gridd's log ("Unlicensed (Unrestricted)" is the host's grace period, no fault).
VGPU_UNLICENSED = re.compile(r"License Status\s*:\s*Unlicensed(?: \((?P<state>Restricted)\))?"
                             r"(?! \(Unrestricted\))|vGPU license state: Unlicensed(?! \(Unr)"
                             r"|Valid GRID license not found|nvidia-gridd(?:\[\d+\])?: Failed to "
                             r"acquire license", IC)
# Triton loading a cubin its bundled ptxas (newer CUDA than the driver) assembled: INVALID_IMAGE
TRITON_IMAGE = re.compile(r"Triton Error \[CUDA\]: device kernel image is invalid", IC)

SIMPLE = {"insufficient-driver": "gpu.driver-too-old",
          "devices-unavailable": "gpu.exclusive-process-mode",
          "invalid-device": "gpu.visible-devices-remapped",
          "ecc": "gpu.ecc-uncorrectable", "ptx": "gpu.ptx-newer-than-driver",
          "system-not-ready": "gpu.fabric-manager-not-running",
          "compat": "gpu.forward-compat-unsupported",
          "driver-mismatch": "gpu.compat-libcuda-mismatch",
          "unknown": "gpu.cuda-unknown-error-driver", "stub": "gpu.libcuda-stub-loaded",
          "too-many-peers": "gpu.p2p-peer-limit", "launch-timeout": "gpu.display-watchdog-timeout"}


def _arch_reading(message: str, text: str, error: str, around: str = "") -> Reading | None:
    """A GPU without kernels: which build lacks it, by what torch and the traceback say.
    torch's verdict on the GPU is printed once, at the first CUDA call, often lines above the
    error it explains: when the message lacks it, the lines around it are read for it."""
    if around and not any(p.search(message) for p in (TOO_OLD, RANGE, INCOMPATIBLE)):
        if any(p.search(around) for p in (TOO_OLD, RANGE, INCOMPATIBLE)):
            return _arch_reading(f"{around}\n{message}", text, error)
    old = TOO_OLD.search(message)
    if old:  # torch's own verdict: the GPU is below the build's minimum capability
        return reading(FAMILY, "gpu.too-old-for-torch", old.group(0), gpu=old["gpu"].strip(),
                       capability=old["cc"], error=error)
    span = RANGE.search(message)
    if span:
        return _range_reading(span, error)
    warn = INCOMPATIBLE.search(message)
    if warn:
        listed = SUPPORTS.search(message)
        arches = [int(a) for a in re.findall(r"_(\d+)", listed["list"])] if listed else []
        arch = int(warn["arch"])
        parts = dict(gpu=warn["gpu"].split(":")[-1].strip(), arch=f"sm_{arch}",
                     build_supports=" ".join(listed["list"].split()) if listed else "")
        if (arches and arch < min(arches)) or (not arches and arch < FLOOR_DROPPED):
            # below everything the wheel has: the GPU is too old
            return reading(FAMILY, "gpu.too-old-for-torch", warn.group(0), **parts)
        if arches and f"sm_{arch}" in listed["list"].split():
            return None  # the build has it: torch's warning is not this failure
        return reading(FAMILY, "gpu.torch-build-lacks-arch", warn.group(0), **parts)
    if not error:
        return None
    if DEEPSPEED.search(message):
        return None  # a DeepSpeed op's own build: the build family reads it
    ext = EXTENSION.search(message)
    if ext:  # the failing kernel is in an extension compiled with its own arch list
        return reading(FAMILY, "torch.arch-list-misses-gpu", text, error=error,
                       extension=ext.group(0))
    # Plain torch failing on the GPU: its wheel has no kernels for it.
    return reading(FAMILY, "gpu.torch-build-lacks-arch", text, error=error)


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _range_reading(span: re.Match, error: str) -> Reading | None:
    cc, lo, hi = _cc(span["cc"]), _cc(span["lo"]), _cc(span["hi"])
    parts = dict(gpu=span["gpu"].strip(), capability=span["cc"],
                 build_supports=f"{span['lo']} - {span['hi']}", error=error)
    if cc < lo:
        return reading(FAMILY, "gpu.too-old-for-torch", span.group(0), **parts)
    if cc[0] > hi[0]:  # a newer major than the build's top: no SASS or PTX runs on it
        return reading(FAMILY, "gpu.torch-build-lacks-arch", span.group(0), **parts)
    return None


def _bytes(size: str) -> float:
    number, unit = size.split()
    return float(number) * UNITS.get(unit.upper(), 1)


def _memory_elsewhere(message: str) -> Reading | None:
    """Out of memory with most of the GPU held outside this process: what this process
    holds and what is free add up to under half the GPU (a batch too large fills it
    itself, and is the user's to fix)."""
    oom = OOM_OLD.search(message) or OOM_NEW.search(message)
    if not oom:
        return None
    total, free, mine = (_bytes(oom[k]) for k in ("total", "free", "mine"))
    if not total or mine + free >= total / 2:
        return None
    return reading(FAMILY, "gpu.memory-held-by-other-process", oom.group(0)[:160],
                   gpu=oom["gpu"], total=oom["total"], free=oom["free"], this_process=oom["mine"],
                   held_elsewhere=f"{(total - mine - free) / 2**30:.2f} GiB")


XFORMERS = re.compile(r"xFormers was built for:\s+PyTorch (?P<built>[\w.+]+) with CUDA "
                      r"(?P<cuda>\d+) \(you have (?P<have>[\w.+]+)\)")


def _release(version: str) -> str:
    return version.partition("+")[0]


def read(message: str, around: str = "") -> list[Reading]:
    if not message:
        return []
    found: list[Reading] = []
    built = XFORMERS.search(message)
    if built:
        have, was = built["have"], built["built"]
        mode = ("torch.cpu-only-build" if have.endswith("+cpu") else
                "loader.ext-built-for-other-torch" if _release(have) != _release(was) else
                "loader.ext-built-for-other-cuda")
        found.append(reading(FAMILY, mode, built.group(0), extension="xFormers",
                             built_for=f"torch {was}", installed=f"torch {have}"))
    if tcnn := TCNN.search(message):  # built with TCNN_CUDA_ARCHITECTURES, not torch's list
        found.append(reading(FAMILY, "torch.arch-list-misses-gpu", tcnn.group(0),
                             extension="tinycudann", capability=tcnn.group(1)))
    flash = FLASH_AMPERE.search(message)
    if flash:
        found.append(reading(FAMILY, "gpu.flash-attn-needs-ampere", flash.group(0)))
    triton = TRITON_OLD.search(message)
    if triton:
        found.append(reading(FAMILY, "gpu.too-old-for-triton", triton.group(0)[:120],
                             gpu=triton["gpu"].strip(), capability=triton["cc"]))
    bf16 = BF16_GEMM.search(message)
    if bf16:
        found.append(reading(FAMILY, "job.bf16-unsupported-gpu", bf16.group(0)[:100],
                             call=bf16.group(0).split("calling", 1)[1].strip(" `").split("(")[0],
                             dtype="CUDA_R_16BF"))
    arch_status, cc = LIB_ARCH.search(message), CAPABILITY.search(f"{around}\n{message}")
    if arch_status and not REDUCED.search(message) and not (cc and _cc(cc["cc"]) >= (5, 0)):
        found.append(reading(FAMILY, "gpu.too-old-for-cuda-library", arch_status.group(0),
                             status=arch_status.group(0), capability=cc["cc"] if cc else ""))
    vgpu = VGPU_UNLICENSED.search(message)
    if vgpu:
        found.append(reading(FAMILY, "gpu.vgpu-unlicensed", vgpu.group(0),
                             license=vgpu["state"] or "not held"))
    elsewhere = _memory_elsewhere(message)
    if elsewhere:
        found.append(elsewhere)
    kind = first_error(message)
    if kind is None or kind[0] == "no-kernel-image":
        arch = None
        if kind is None or not NOT_TORCH_KERNELS.search(message):
            arch = _arch_reading(message, kind[1] if kind else "", kind[1] if kind else "",
                                 around if kind else "")
        nvrtc = NVRTC_ARCH.search(message)
        if not arch and nvrtc and not CUPY.search(message):
            arch = reading(FAMILY, "gpu.torch-build-lacks-arch", nvrtc.group(0),
                           error=nvrtc.group(0), compiler="NVRTC (torch's runtime compiler)")
        if arch:
            found.append(arch)
    elif kind[0] == "no-device":
        # Zero devices with a driver present; inside a container the container family says why;
        # a GPU the driver marked lost (read below) is why CUDA sees none
        if not CONTAINER.search(message) and not OFF_BUS.search(message):
            found.append(reading(FAMILY, "gpu.no-visible-gpu", kind[1], error=kind[1],
                                 code=kind[2]))
    elif kind[0] == "driver-mismatch":
        # 803 is CUDA's "display driver / CUDA driver" mismatch: the libcuda loaded is not the
        # running kernel module's. The forward-compat libcuda on the path says which libcuda;
        # NVML's "Driver/library version mismatch" is read below. Bare, it is read as what the
        # error states (a driver update not rebooted into, an image's own libcuda), and
        # alternatives.toml lists the other causes threads settled for the same words.
        compat = COMPAT_LIB.search(message)
        if compat and not NVML_MISMATCH.search(message):
            found.append(reading(FAMILY, SIMPLE["driver-mismatch"], kind[1], error=kind[1],
                                 code=kind[2], compat_library=compat.group(0)))
        elif not NVML_MISMATCH.search(message):
            found.append(reading(FAMILY, "gpu.driver-library-mismatch", kind[1], error=kind[1],
                                 code=kind[2]))
    elif kind[0] == "stub":
        path = STUB_PATH.search(message)
        found.append(reading(FAMILY, SIMPLE["stub"], kind[1], error=kind[1], code=kind[2],
                             loaded=path.group(0) if path else ""))
    elif kind[0] == "invalid-device" and (mig := MIG.search(message) or MIG.search(around)):
        found.append(reading(FAMILY, "gpu.mig-one-instance-per-process", kind[1], error=kind[1],
                             code=kind[2], mig=mig.group(0)[:60]))
    elif kind[0] == "insufficient-driver" and (none := NO_NVIDIA.search(f"{message}\n{around}")):
        found.append(reading(FAMILY, "gpu.no-gpu-on-node", kind[1], error=kind[1], code=kind[2],
                             no_nvidia=none.group(0)))
    elif kind[0] == "invalid-device" or kind[0] in SIMPLE:
        found.append(reading(FAMILY, SIMPLE[kind[0]], kind[1], error=kind[1], code=kind[2]))
    # (the MIG evidence may be the node's nvidia-smi pasted around the error)
    assertion, mig = NUM_GPUS.search(message), MIG.search(message) or MIG.search(around)
    if assertion and mig and not (kind and kind[0] == "invalid-device"):
        found.append(reading(FAMILY, "gpu.mig-one-instance-per-process", assertion.group(0),
                             error=assertion.group(0), mig=mig.group(0)[:60]))
    elif assertion:  # torch counted more GPUs than CUDA now shows: the variable changed after
        found.append(reading(FAMILY, "gpu.visible-devices-changed-after-count",
                             assertion.group(0), device=assertion["device"] or "",
                             counted=assertion["count"] or ""))
    image = TRITON_IMAGE.search(message)
    if image and not (kind and kind[0] == "ptx"):
        found.append(reading(FAMILY, "gpu.ptx-newer-than-driver", image.group(0),
                             error=image.group(0), compiler="Triton's bundled ptxas"))
    xla = XLA_PTX.search(message)
    if xla and not (kind and kind[0] == "ptx"):
        found.append(reading(FAMILY, "gpu.ptx-newer-than-driver", xla.group(0)[:120],
                             driver_supports_cuda=re.sub(r"\s", "", xla["driver"] or ""),
                             ptx_compiler=xla["ptxas"] or ""))
    if fm := FM_MISMATCH.search(message):
        found.append(reading(FAMILY, "gpu.fabric-manager-not-running", fm.group(0),
                             fabric_manager=fm["fm"], driver=fm["driver"]))
    both = f"{message}\n{around}"  # the assembler's line and the driver call, one on this line
    if (ptx := DRIVER_PTXAS.search(both)) and DRIVER_JIT.search(both) and (
            ptx.start() < len(message) or DRIVER_JIT.search(message)):
        found.append(reading(FAMILY, "gpu.ptx-newer-than-driver", ptx.group(0),
                             ptx_isa=ptx["ptx"], driver_reads_up_to=ptx["driver"]))
    old = DRIVER_OLD.search(message)
    if old:  # torch gives the driver's CUDA version as 1000*major + 10*minor
        v = int(old["v"])
        found.append(reading(FAMILY, "gpu.driver-too-old", old.group(0),
                             driver_supports_cuda=f"{v // 1000}.{v % 1000 // 10}"))
    no_driver = NO_DRIVER.search(message)
    if no_driver and (started := NO_GPU_CONTAINER.search(both)):
        found.append(reading(FAMILY, "container.no-gpu-runtime", no_driver[0],
                             container=started.group(0).strip()[:100]))
    elif no_driver and not CONTAINER.search(message) and not ext_build_without_gpu(message, around):
        # No libcuda at all: a machine without the driver (a container is the container's)
        found.append(reading(FAMILY, "gpu.no-gpu-on-node", no_driver[0]))
    elif counted := NONE_COUNTED.search(message):
        found.append(reading(FAMILY, "gpu.no-gpu-on-node", counted.group(0), counted_by=(
            "DeepSpeed's runner, on the node that launches" if "Unable" in counted.group(0)
            else "torch's NCCL process group, in the rank")))
    mismatch = NVML_MISMATCH.search(message)
    if mismatch:  # NVML's library and the loaded kernel module differ
        found.append(reading(FAMILY, "gpu.driver-library-mismatch", mismatch.group(0),
                             nvml_library=mismatch["lib"] or ""))
    smi = SMI_NO_DRIVER.search(message)
    if smi:
        found.append(reading(FAMILY, "gpu.driver-module-not-loaded", smi.group(0)))
    xid = XID.search(message)
    if xid and xid["xid"] in ("48", "94", "95"):  # Xid 48/94/95: double-bit ECC errors
        found.append(reading(FAMILY, "gpu.ecc-uncorrectable", xid.group(0), xid=xid["xid"],
                             pci=xid["bus"]))
    if (xid and xid["xid"] == "79") or OFF_BUS.search(message):  # Xid 79: GPU off the bus
        found.append(reading(FAMILY, "gpu.fallen-off-bus", (xid or OFF_BUS.search(message))
                             .group(0), xid=xid["xid"] if xid else "", pci=xid["bus"] if xid else ""))
    if lost := SMI_NO_HANDLE.search(message):
        found.append(reading(FAMILY, "gpu.fallen-off-bus", lost.group(0), pci=lost["bus"]))
    if hook := HOOK_CUDA.search(message):
        found.append(reading(FAMILY, "gpu.cuda-unknown-error-driver", hook.group(0),
                             error=hook["what"], where="the container hook's cuInit, on the host"))
    init, opened = RM_INIT.search(f"{around}\n{message}"), OPEN_REQUIRED.search(message)
    none_found = NO_DEVICES.search(message)
    if init and (none_found or RM_INIT.search(message)):
        found.append(reading(FAMILY, "gpu.rm-init-adapter-failed", init.group(0),
                             code=init["code"] or ""))
    elif opened or none_found:
        found.append(reading(FAMILY, "gpu.closed-kernel-module-unsupported-gpu",
                             (opened or none_found).group(0),
                             pci_id=(opened["pci"] or "") if opened else ""))
    cpu = NO_CUDA.search(message)
    if cpu:  # torch's own check: the installed build has no CUDA at all
        found.append(reading(FAMILY, "torch.cpu-only-build", cpu.group(0)))
    nccl = NO_NCCL.search(message)
    if nccl:  # init_process_group('nccl') with a build that has no NCCL
        found.append(reading(FAMILY, "torch.no-nccl-in-build", nccl.group(0),
                             platform="windows" if WINDOWS.search(message) else ""))
    if shmem := TRITON_SHMEM.search(message):
        found.append(reading(FAMILY, "gpu.triton-kernel-exceeds-shared-memory", shmem.group(0),
                             kernel_needs=f"{int(shmem['need']) // 1024} KiB",
                             gpu_has=f"{int(shmem['limit']) // 1024} KiB per block"))
    lightning = LIGHTNING_GPUS.search(message)
    if lightning and lightning["visible"] != "[]":  # none visible at all is another cause
        found.append(reading(FAMILY, "gpu.visible-devices-remapped", lightning.group(0),
                             requested=lightning["asked"], visible=lightning["visible"] or ""))
    include, slot = DS_INCLUDE.search(message), NO_SLOT.search(message)
    if slot or (include and "parse_inclusion_exclusion" in message):
        # The deepspeed runner was given device indices outside the visible set.
        found.append(reading(FAMILY, "gpu.visible-devices-remapped",
                             (slot or include).group(0),
                             visible=include["visible"] if include else "",
                             include=include["include"] if include else "",
                             slot=slot["slot"] if slot else "", host=slot["host"] if slot else ""))
    return found
