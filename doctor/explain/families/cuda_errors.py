"""CUDA's errors in every form they are printed: the runtime's text ("no kernel image is available
for execution on the device"), the enum name of either API (cudaErrorNoKernelImageForDevice,
CUDA_ERROR_NO_BINARY_FOR_GPU), or only a number inside a wrapper's frame ("cuda runtime error
(802)", "error == cudaSuccess (46 vs. 0)"), each read into one error kind. The gpu family reads
the kind with what torch says around it; alternatives.toml's cuda_errors name kinds."""

from __future__ import annotations

import re

IC = re.IGNORECASE

# The runtime's text and enum names (runtime and driver API) of each error kind.
KINDS = (
    ("insufficient-driver", r"CUDA driver version is insufficient for CUDA runtime version"
     r"|cudaErrorInsufficientDriver|CUDA_ERROR_INSUFFICIENT_DRIVER"),
    ("devices-unavailable", r"all CUDA-capable devices are busy or unavailable"
     r"|CUDA-capable device\(s\) is/are busy or unavailable|cudaErrorDevicesUnavailable"),
    ("no-device", r"no CUDA-capable device is detected|No CUDA GPUs are available"
     r"|cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE"),
    ("invalid-device", r"invalid device ordinal|cudaErrorInvalidDevice\b|CUDA_ERROR_INVALID_DEVICE"),
    ("no-kernel-image", r"no kernel image is available for execution on the device"
     r"|cudaErrorNoKernelImageForDevice|CUDA_ERROR_NO_BINARY_FOR_GPU"
     # The same failure in CUDA's older words: a kernel launched with no code for this GPU's
     # arch (torch built on another node's GPU, a wheel without sm_50, an old GPU dropped).
     r"|(?<!HIP error: )invalid device function|cudaErrorInvalidDeviceFunction"),
    # CUDA's limit of eight peer mappings per device (the runtime's old error 60, now 711)
    ("too-many-peers", r"peer mapping resources exhausted|cudaErrorTooManyPeers"
     r"|CUDA_ERROR_TOO_MANY_PEERS"),
    ("ecc", r"uncorrectable ECC error encountered|cudaErrorECCUncorrectable"
     r"|CUDA_ERROR_ECC_UNCORRECTABLE"),
    ("ptx", r"provided PTX was compiled with an unsupported toolchain"
     r"|cudaErrorUnsupportedPtxVersion|CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    ("system-not-ready", r"system not yet initialized|cudaErrorSystemNotReady"
     r"|CUDA_ERROR_SYSTEM_NOT_READY"),
    # The libcuda loaded is not the running kernel driver's (a forward-compat libcuda beside a
    # driver it was not made for, most often): CUDA's cudaErrorSystemDriverMismatch.
    ("driver-mismatch", r"system has unsupported display driver ?/ ?cuda driver combination"
     r"|cudaErrorSystemDriverMismatch|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    ("compat", r"forward compatibility was attempted on non supported HW"
     r"|cudaErrorCompatNotSupportedOnDevice|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    # The toolkit's stub libcuda.so (for linking only) loaded instead of the driver's.
    ("stub", r"CUDA driver is a stub library|cudaErrorStubLibrary|CUDA_ERROR_STUB_LIBRARY"),
    # The display driver's watchdog (Windows TDR, X's) ended a kernel that ran too long
    ("launch-timeout", r"the launch timed out and was terminated|cudaErrorLaunchTimeout"
     r"|CUDA_ERROR_LAUNCH_TIMEOUT"),
    ("unknown", r"CUDA unknown error|cudaErrorUnknown|CUDA_ERROR_UNKNOWN"
     r"|error=\d+ : unknown error|cuda runtime error \(\d+\) : unknown error"
     # Caffe's check, deviceQuery, ollama's cudart probe (30 is "unknown" before CUDA 10.1)
     r"|cudaSuccess \((?:30|999) vs\. 0\)\s*unknown error|cudaGetDeviceCount returned (?:30|999)\b"
     r"|\b(?:cudart|cuda driver library) init failure: 999\b|\bcudaSetDevice err: 999\b"),
)
KIND_TEXT = [(kind, re.compile(pattern, IC)) for kind, pattern in KINDS]
# cudaError_t numbers (CUDA >= 10.1; 35 and 46 kept their numbers from the older table).
# Numbers whose meaning changed in the renumbering (10, 30, 38, 39, 48) are left to the text.
CODES = {35: "insufficient-driver", 46: "devices-unavailable", 98: "no-kernel-image",
         100: "no-device", 101: "invalid-device", 209: "no-kernel-image", 214: "ecc", 222: "ptx",
         702: "launch-timeout",
         711: "too-many-peers", 802: "system-not-ready", 803: "driver-mismatch", 804: "compat",
         999: "unknown"}
# A number is read only inside a frame that says it is a CUDA error code.
CODE_FRAME = re.compile(
    r"cuda runtime error \((\d+)\)|CUDA Runtime Error\((\d+)\)|Cuda failure:? (\d+)"
    r"|cudaSuccess \((\d+) vs\. 0\)|THCudaCheck FAIL[^\n]*? error=(\d+)"
    r"|cudaGetDevice\w*\(\)[^\n]*? Error (\d+):|Return value (\d+) from '(?:cu\w+)"
    r"|code=(\d+)\(cuda\w+\)", IC)
# The driver API's numbers in the frames of its Python wrappers (numba's CudaAPIError, Warp's
# "(CUDA error N)", a cu* call's "Return value N"): there 34 is CUDA_ERROR_STUB_LIBRARY (the
# runtime's old table had another error at 34, so torch's frames are not read for it).
DRIVER_FRAME = re.compile(r"CudaAPIError: \[(\d+)\]|Warp CUDA error[^\n]*?\(CUDA error (\d+)\)"
                          r"|Return value (\d+) from '(?:cu\w+)", IC)
DRIVER_CODES = {34: "stub"}
# A CUDA error quoted with its text (NCCL's "Cuda failure '...'", torch's "CUDA error: ..."):
# when the first one is not a kind read here, later CUDA errors are its consequences.
QUOTED = re.compile(r"Cuda failure\s+'(?P<q>[^'\n]+)'|CUDA error:\s*(?P<c>[^\n]+)", IC)

# torch's words for a process that finds no libcuda/driver at all (torch/cuda/__init__.py)
NO_DRIVER = re.compile(r"Found no NVIDIA driver on your system", IC)
# A project's own .cu code printing the CUDA error of its kernel (DCN's and Deformable-DETR's
# "error in <kernel>:", pointnet2's "CUDA kernel failed :" and "at L:N in x.cu"): torch's never do
OWN_KERNEL_ERROR = re.compile(r"\berror in \w+:\s*(?:no kernel image is available|invalid device "
                              r"function)|\bCUDA kernel failed\s*:\s*(?:no kernel image is available"
                              r"|invalid device function)|\bat L:\d+ in \S+\.cu\b", IC)


def first_error(message: str) -> tuple[str, str, str] | None:
    """(kind, the text that says it, the number) of the first CUDA error in ``message``."""
    found = []
    for kind, pattern in KIND_TEXT:
        m = pattern.search(message)
        if m:
            found.append((m.start(), kind, m.group(0), ""))
    for m in CODE_FRAME.finditer(message):
        code = next(g for g in m.groups() if g)
        if int(code) in CODES:
            found.append((m.start(), CODES[int(code)], m.group(0), code))
    for m in DRIVER_FRAME.finditer(message):
        code = next(g for g in m.groups() if g)
        if int(code) in DRIVER_CODES:
            found.append((m.start(), DRIVER_CODES[int(code)], m.group(0), code))
    if not found:
        return None
    first = QUOTED.search(message)
    if first and first.start() < min(found)[0] and not any(
            p.search(first["q"] or first["c"]) for _, p in KIND_TEXT):
        return None  # an error of another kind came first (NCCL's unsupported driver API ...)
    # The first error reported is the kind; its words say it best, its number adds to them.
    _, kind, text, _ = min(found)
    text = next((t for _, k, t, c in found if k == kind and not c), text)
    code = next((c for _, k, _, c in found if k == kind and c), "")
    return kind, text, code


def error_kind(message: str) -> str | None:
    """The kind of the first CUDA error in ``message`` (KINDS), in whichever of its forms."""
    found = first_error(message)
    return found[0] if found else None
