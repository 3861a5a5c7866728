"""A kernel on each visible NVIDIA GPU through the CUDA driver itself, without torch.

``import torch`` and initialising CUDA through it took 4.4 s of the doctor's 4.7 s on an H200
node (2026-11-26): more than DeepSpeed's whole ``ds_report``. Whether the GPUs take work does
not need torch. This probe asks the driver's own library (libcuda.so.1, which torch's CUDA
runtime calls too) through ctypes, in a subprocess of dsenv's interpreter started without
site-packages (``-I -S``: ~20 ms): ``cuInit``, then on each device, in a thread of its own,
its primary context, a PTX kernel that the driver JIT-compiles for whatever architecture it
is (it writes 2*i to four floats), the floats copied back and summed (12.0, as torch's
tensor-op probe sums). Where the driver has no PTX compiler (a container without
libnvidia-ptxjitcompiler) a memset and a copy back stand in for the kernel, and say so.

The subprocess has a timeout (a GPU in a bad state hangs ``cuInit``); the job's variables
apply (CUDA_VISIBLE_DEVICES hides devices here as it does for the job). Each step's seconds
come back with the answer, so a report shows where the time went.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from dsenv import proc
from dsenv.facts.node import Node, probe

MARKER = "DSENV_CUDA_DRIVER "
EXPECTED_SUM = 12.0  # 2 * (0 + 1 + 2 + 3), the kernel's four floats

# PTX ISA 6.0 for sm_50: every driver since CUDA 9 JIT-compiles it for its GPUs, Blackwell's
# included (PTX is forward compatible). out[tid] = 2 * tid.
PTX = """\
.version 6.0
.target sm_50
.address_size 64

.visible .entry dsenv_twice(.param .u64 dsenv_twice_out)
{
    .reg .f32 %f<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [dsenv_twice_out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    cvt.rn.f32.u32 %f1, %r1;
    add.f32 %f2, %f1, %f1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f2;
    ret;
}
"""

SCRIPT = r'''
import ctypes as C, json, sys, threading, time
T0 = time.perf_counter()
out = {"driver_version": None, "device_count": 0, "devices": [], "init_error": None,
       "seconds": {}}
def emit():
    out["seconds"]["total"] = round(time.perf_counter() - T0, 4)
    print(__MARK__ + json.dumps(out))
    sys.exit(0)
try:
    cu = C.CDLL("libcuda.so.1")
except OSError as exc:
    out["init_error"] = "cannot load libcuda.so.1: %s" % exc
    emit()
out["seconds"]["load"] = round(time.perf_counter() - T0, 4)
P, U64, SZ, UI, I = C.c_void_p, C.c_uint64, C.c_size_t, C.c_uint, C.c_int
def sig(name, *argtypes):
    fn = getattr(cu, name)
    fn.argtypes, fn.restype = list(argtypes), C.c_int
    return fn
def fn_or(name, fallback, *argtypes):
    return sig(name if hasattr(cu, name) else fallback, *argtypes)
cuGetErrorName = sig("cuGetErrorName", C.c_int, C.POINTER(C.c_char_p))
retain = sig("cuDevicePrimaryCtxRetain", C.POINTER(P), I)
release = fn_or("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", I)
set_current = sig("cuCtxSetCurrent", P)
load_data = sig("cuModuleLoadData", C.POINTER(P), C.c_char_p)
get_function = sig("cuModuleGetFunction", C.POINTER(P), P, C.c_char_p)
unload = sig("cuModuleUnload", P)
alloc = sig("cuMemAlloc_v2", C.POINTER(U64), SZ)
free = sig("cuMemFree_v2", U64)
memset = sig("cuMemsetD32_v2", U64, UI, SZ)
to_host = sig("cuMemcpyDtoH_v2", P, U64, SZ)
launch = sig("cuLaunchKernel", P, UI, UI, UI, UI, UI, UI, UI, P, C.POINTER(P), C.POINTER(P))
synchronize = sig("cuCtxSynchronize")
JIT_MISSING = {218, 221, 222}  # INVALID_PTX, JIT_COMPILER_NOT_FOUND, UNSUPPORTED_PTX_VERSION
class CudaError(Exception):
    pass
def call(fn, *args):
    rc = fn(*args)
    if rc:
        name = C.c_char_p()
        text = name.value.decode() if cuGetErrorName(rc, C.byref(name)) == 0 and name.value \
            else "error %d" % rc
        raise CudaError("%s: %s" % (fn.__name__, text), rc)
try:
    call(sig("cuInit", UI), 0)
    value = C.c_int()
    call(sig("cuDriverGetVersion", C.POINTER(C.c_int)), C.byref(value))
    out["driver_version"] = "%d.%d" % (value.value // 1000, value.value % 1000 // 10)
    call(sig("cuDeviceGetCount", C.POINTER(C.c_int)), C.byref(value))
    out["device_count"] = value.value
except CudaError as exc:
    out["init_error"] = exc.args[0]
    emit()
out["seconds"]["init"] = round(time.perf_counter() - T0, 4)
PTX_TEXT = __PTX__.encode()
def one(index, d):
    start = time.perf_counter()
    ctx, module, memory, device = P(), P(), U64(0), C.c_int()
    try:
        call(sig("cuDeviceGet", C.POINTER(C.c_int), I), C.byref(device), index)
        name = C.create_string_buffer(256)
        call(sig("cuDeviceGetName", C.c_char_p, I, I), name, 256, device)
        attr = sig("cuDeviceGetAttribute", C.POINTER(C.c_int), I, I)
        major, minor = C.c_int(), C.c_int()
        call(attr, C.byref(major), 75, device)  # COMPUTE_CAPABILITY_MAJOR
        call(attr, C.byref(minor), 76, device)
        d.update(name=name.value.decode(errors="replace"),
                 capability="%d.%d" % (major.value, minor.value))
        call(retain, C.byref(ctx), device)
        call(set_current, ctx)
        d["context_s"] = round(time.perf_counter() - start, 4)
        call(alloc, C.byref(memory), 16)
        try:
            call(load_data, C.byref(module), PTX_TEXT)
        except CudaError as exc:
            if exc.args[1] not in JIT_MISSING:
                raise
            module = None
            d["note"] = "no PTX JIT (%s): a memset stood in for the kernel" % exc.args[0]
        if module is not None:
            kernel, arg = P(), U64(memory.value)
            call(get_function, C.byref(kernel), module, b"dsenv_twice")
            params = (P * 1)(C.cast(C.pointer(arg), P))
            call(launch, kernel, 1, 1, 1, 4, 1, 1, 0, None, params, None)
            d["work"] = "kernel"
        else:
            call(memset, memory.value, 0x40400000, 4)  # 3.0f each: the same sum
            d["work"] = "memset"
        call(synchronize)
        host = (C.c_float * 4)()
        call(to_host, C.cast(host, P), memory.value, 16)
        d["tensor_sum"] = float(sum(host))
    except CudaError as exc:
        d["error"] = exc.args[0]
    finally:
        if memory.value:
            free(memory.value)
        if module:
            unload(module)
        if ctx:
            release(device)
    d["seconds"] = round(time.perf_counter() - start, 4)
threads = []
for index in range(out["device_count"]):
    d = {"index": index}
    out["devices"].append(d)
    threads.append(threading.Thread(target=one, args=(index, d)))
for t in threads:
    t.start()
for t in threads:
    t.join()
emit()
'''.replace("__MARK__", repr(MARKER)).replace("__PTX__", repr(PTX))


@dataclass(frozen=True)
class DriverDevice:
    index: int
    name: str | None = None
    capability: str | None = None
    work: str | None = None  # "kernel", or "memset" where the driver cannot JIT PTX
    tensor_sum: float | None = None
    error: str | None = None
    note: str | None = None
    seconds: float | None = None
    context_s: float | None = None

    @property
    def arch(self) -> str | None:
        return self.capability

    @property
    def usable(self) -> bool:
        return self.error is None and self.tensor_sum == EXPECTED_SUM


@dataclass(frozen=True)
class DriverRun:
    ran: bool  # False: the probe did not run, hung or crashed; see `problem`
    problem: str = ""
    driver_version: str | None = None  # "13.0": the CUDA version the driver supports
    device_count: int = 0
    devices: tuple[DriverDevice, ...] = ()
    init_error: str | None = None
    hung: bool = False
    seconds: dict = field(default_factory=dict, compare=False)  # step -> seconds
    evidence: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return self.ran and self.init_error is None and self.device_count > 0


def parse_output(stdout: str) -> DriverRun:
    data = proc.marked_json(stdout, MARKER)
    if not isinstance(data, dict):
        raise ValueError("the CUDA driver probe printed no result line that parses")
    devices = tuple(DriverDevice(**{k: d.get(k) for k in DriverDevice.__dataclass_fields__})
                    for d in data.get("devices") or [])
    return DriverRun(True, driver_version=data.get("driver_version"),
                     device_count=int(data.get("device_count") or 0), devices=devices,
                     init_error=data.get("init_error"), seconds=dict(data.get("seconds") or {}))


def interpreter() -> list[str]:
    """dsenv's own interpreter, isolated and without site-packages: the script needs ctypes
    alone. Tests swap this for a recorded answer."""
    return [sys.executable, "-I", "-S"]


def probe_timeout(node: Node) -> float:
    """cuInit and a context on every GPU: slower than one tool call on a big node."""
    return node.probe_timeout * 2


@probe
def driver_run(node: Node) -> DriverRun:
    """Run the script once per node (callers decide whether GPUs are worth asking)."""
    result = node.run([*interpreter(), "-c", SCRIPT], timeout=probe_timeout(node))
    if result.timed_out:
        return DriverRun(False, result.describe(), hung=True)
    try:
        return parse_output(result.stdout)
    except ValueError:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return DriverRun(False, result.describe(), evidence=tuple(tail))
