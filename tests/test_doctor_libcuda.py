"""gpu.libcuda: the libcuda.so.1 programs load (LD_LIBRARY_PATH, then the ld.so cache) against
the loaded NVIDIA kernel module (issue 23: CUDA's 803 before the job, not in it).

Recorded real outputs: the kernel module's /proc/driver/nvidia/version in its proprietary form
(tensorflow#22525, a node whose libcuda was 375.66 under a 384.130 module: the failing case as
it happened, and its twin with the module's own libcuda) and its open form (nixGL#186), and
`ldconfig -p` with CUDA 13.0's forward-compat libcuda first (nvidia-container-toolkit#1679).
The library files are laid out as the loader would find them; their versions are the only
thing the test chooses.
"""

from __future__ import annotations

import os

import pytest

from dsenv.facts.gpu import libcuda
from dsenv.verdicts.findings import Status
from tests.harness.recorded import fixture_text


def libcuda_in(folder, version):
    """folder/libcuda.so.1 -> libcuda.so.<version>, as the driver installs it."""
    folder.mkdir(parents=True, exist_ok=True)
    real = folder / (f"libcuda.so.{version}" if version else "libcuda.so")
    real.write_bytes(b"\x7fELF")
    os.symlink(real.name, folder / "libcuda.so.1")
    return folder


@pytest.fixture
def node(make_ctx, run_one, tmp_path, fake_bin):
    """judge(module fixture or None, **env): gpu.libcuda on a root holding that module."""
    root = tmp_path / "root"

    def judge(module="gpu/proc_driver_nvidia_version_384.txt", ldconfig=None, **env):
        if module:
            proc = root / "proc" / "driver" / "nvidia"
            proc.mkdir(parents=True, exist_ok=True)
            (proc / "version").write_text(fixture_text(module))
        bin_dir = fake_bin("ldconfig", f"cat <<'EOF'\n{fixture_text(ldconfig)}EOF\n"
                           if ldconfig else "exit 0\n")
        ctx = make_ctx(env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env}, root=root)
        return run_one("gpu.libcuda", ctx)

    return judge


def test_a_libcuda_of_another_driver_than_the_module_fails(node, tmp_path):
    lib = libcuda_in(tmp_path / "driver", "375.66")
    result = node(LD_LIBRARY_PATH=str(lib))
    assert result.status is Status.FAIL and result.mode == "gpu.driver-library-mismatch"
    assert "driver 375.66, while the kernel module is 384.130" in result.summary
    assert "error 803" in result.summary and "reboot" in result.fix.lower()


def test_the_modules_own_libcuda_passes(node, tmp_path):
    lib = libcuda_in(tmp_path / "driver", "384.130")
    result = node(LD_LIBRARY_PATH=str(lib))
    assert result.status is Status.OK and "384.130, the kernel module's" in result.summary


def test_the_open_modules_form_is_read(node, tmp_path):
    lib = libcuda_in(tmp_path / "driver", "565.57.01")
    result = node("gpu/proc_driver_nvidia_version_open_565.txt", LD_LIBRARY_PATH=str(lib))
    assert result.status is Status.OK, result


@pytest.mark.parametrize("compat, status, mode", [
    ("550.54.15", Status.FAIL, "gpu.compat-libcuda-mismatch"),  # older than the module: 803
    ("580.65.06", Status.INFO, ""),  # newer: forward compatibility, as meant
])
def test_the_compat_libcuda_first_in_the_ld_cache(node, tmp_path, compat, status, mode):
    root = tmp_path / "root"
    libcuda_in(root / "usr/local/cuda-13.0/compat", compat)
    libcuda_in(root / "usr/lib/aarch64-linux-gnu/nvidia", "565.57.01")
    result = node("gpu/proc_driver_nvidia_version_open_565.txt",
                  ldconfig="gpu/ldconfig_p_libcuda_compat_first.txt")
    assert result.status is status and result.mode == mode, result
    assert "cuda-13.0/compat/libcuda.so" in result.evidence[0]
    assert "the ld.so cache" in result.evidence[0]
    if status is Status.FAIL:
        assert "take" in " ".join(result.evidence) and "compat" in " ".join(result.evidence)


def test_ld_library_path_comes_before_the_cache(node, tmp_path):
    root = tmp_path / "root"
    libcuda_in(root / "usr/local/cuda-13.0/compat", "550.54.15")
    first = libcuda_in(tmp_path / "driver", "565.57.01")
    result = node("gpu/proc_driver_nvidia_version_open_565.txt",
                  ldconfig="gpu/ldconfig_p_libcuda_compat_first.txt", LD_LIBRARY_PATH=str(first))
    assert result.status is Status.OK and f"LD_LIBRARY_PATH ({first})" in result.evidence[0]


def test_what_cannot_be_compared_skips_with_the_reason(node, tmp_path):
    no_module = node(module=None, LD_LIBRARY_PATH=str(libcuda_in(tmp_path / "a", "384.130")))
    assert no_module.status is Status.SKIP and "no NVIDIA kernel module" in no_module.summary
    no_lib = node()
    assert no_lib.status is Status.SKIP and "no libcuda.so.1" in no_lib.summary
    unversioned = node(LD_LIBRARY_PATH=str(libcuda_in(tmp_path / "b", None)))
    assert unversioned.status is Status.SKIP and "carries no driver version" in unversioned.summary


def test_the_module_version_in_both_forms():
    assert libcuda.parse_module_version(
        fixture_text("gpu/proc_driver_nvidia_version_384.txt")) == "384.130"
    assert libcuda.parse_module_version(
        fixture_text("gpu/proc_driver_nvidia_version_open_565.txt")) == "565.57.01"
    assert libcuda.parse_module_version("") is None
