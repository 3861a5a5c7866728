"""Stand-ins for a GPU node's slow parts, built on a CPU machine: a libcuda.so.1 that answers
the driver calls dsenv's CUDA driver probe makes (dsenv/facts/gpu/cuda_driver.py) and a
libtorch_cuda.so whose ``.nv_fatbin`` section lists given kernels.

The fake driver "runs" the probe's kernel on the host: cuLaunchKernel writes 2*i into the
buffer its argument points at, as the PTX kernel does on a GPU. Variables steer it:
FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_INIT_MS (cuInit sleeps that long, as a big node's
driver does), FAKE_CUDA_INIT_RC (cuInit's error), FAKE_CUDA_NO_JIT (cuModuleLoadData answers
CUDA_ERROR_JIT_COMPILER_NOT_FOUND), FAKE_CUDA_LOG (a file each cuInit appends a line to).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

needs_cc = pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler")

LIBCUDA_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int env_int(const char *name, int fallback) {
    const char *v = getenv(name); return v && *v ? atoi(v) : fallback;
}
int cuGetErrorName(int rc, const char **s) {
    switch (rc) {
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 221: *s = "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"; return 0;
    case 999: *s = "CUDA_ERROR_UNKNOWN"; return 0;
    default: *s = 0; return 1;
    }
}
int cuInit(unsigned flags) {
    const char *log = getenv("FAKE_CUDA_LOG");
    if (log) { FILE *f = fopen(log, "a"); if (f) { fputs("cuInit\n", f); fclose(f); } }
    usleep(1000 * env_int("FAKE_CUDA_INIT_MS", 0));
    return env_int("FAKE_CUDA_INIT_RC", 0);
}
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = env_int("FAKE_CUDA_DEVICES", 1); return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int n, int d) { snprintf(s, n, "NVIDIA H200"); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 75 ? 9 : 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)(intptr_t)(d + 1); return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuModuleLoadData(void **m, const char *ptx) {
    if (env_int("FAKE_CUDA_NO_JIT", 0)) return 221;
    if (!strstr(ptx, ".entry dsenv_twice")) return 999;
    *m = (void *)1; return 0;
}
int cuModuleGetFunction(void **f, void *m, const char *name) { *f = (void *)2; return 0; }
int cuModuleUnload(void *m) { return 0; }
int cuMemAlloc_v2(uint64_t *p, size_t n) { *p = (uint64_t)(uintptr_t)calloc(1, n); return 0; }
int cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); return 0; }
int cuMemsetD32_v2(uint64_t p, unsigned v, size_t n) {
    for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)p)[i] = v; return 0;
}
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
    memcpy(dst, (void *)(uintptr_t)src, n); return 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    float *out = (float *)(uintptr_t)*(uint64_t *)params[0];
    for (unsigned i = 0; i < bx; i++) out[i] = 2.0f * i;
    return 0;
}
int cuCtxSynchronize(void) { return 0; }
"""


def build_libcuda(folder: Path) -> Path:
    """``folder/libcuda.so.1``, built by this machine's C compiler; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "fakecuda.c"
    source.write_text(LIBCUDA_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(folder / "libcuda.so.1"),
                    str(source)], check=True, timeout=120, capture_output=True)
    return folder


def fatbin_elf(path: Path, entries: list[tuple[str, int]]) -> Path:
    """A 64-bit ELF whose ``.nv_fatbin`` holds one container of ``entries``, each ("elf" or
    "ptx", arch number such as 90): what dsenv's reader reads of a real library."""
    entry_header = struct.Struct("<HHIQIIHHI")
    body = b"".join(entry_header.pack(2 if kind == "elf" else 1, 0x101, 64, 0, 0, 0,
                                      arch % 10, arch // 10, arch) + bytes(64 - 32)
                    for kind, arch in entries)
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    names = b"\0.shstrtab\0.nv_fatbin\0"
    names_at = 64
    fatbin_at = (names_at + len(names) + 7) // 8 * 8
    headers_at = (fatbin_at + len(fatbin) + 7) // 8 * 8
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    elf_header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, headers_at, 0, 64, 0, 0,
                                     64, 3, 1)

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    data = bytearray(elf_header)
    data += bytes(names_at - len(data)) + names
    data += bytes(fatbin_at - len(data)) + fatbin
    data += bytes(headers_at - len(data))
    data += section(0, 0, 0, 0) + section(1, 3, names_at, len(names)) \
        + section(11, 1, fatbin_at, len(fatbin))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))
    return path
