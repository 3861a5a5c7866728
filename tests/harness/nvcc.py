"""Real shared objects with device code, built by this machine's nvcc (a CUDA toolkit in
/usr/local/cuda*; the tests that need one are marked ``needs_nvcc``)."""

from __future__ import annotations

import glob
import subprocess

import pytest

REAL_NVCC = sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))
needs_nvcc = pytest.mark.skipif(not REAL_NVCC, reason="no CUDA toolkit in /usr/local/cuda*")
KERNEL = ("__global__ void add(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + "
          "threadIdx.x; if (i < n) x[i] += a; }\n"
          "extern \"C\" void launch(float* x, float a, int n) { add<<<(n + 255) / 256, 256>>>"
          "(x, a, n); }\n")


def compile_so(tmp_path, name: str, *gencode: str):
    """A real shared object with device code, built by this machine's nvcc (~2 s)."""
    source = tmp_path / f"{name}.cu"
    source.write_text(KERNEL)
    out = tmp_path / f"{name}.so"
    flags = [f"-gencode={g}" for g in gencode]
    subprocess.run([REAL_NVCC[-1], "-shared", "-Xcompiler", "-fPIC", *flags, str(source), "-o",
                    str(out)], check=True, timeout=300, capture_output=True)
    return out
