"""The ROCm family parser (doctor/explain/families/rocm.py) on the real texts of
tests/fixtures/explain_symptoms/rocm.jsonl: each is read into its parts and the mode its
thread established; texts of other families and empty text give no reading."""

from __future__ import annotations

import pytest

from dsenv.doctor.explain.families import rocm
from tests.harness import symptoms

ROWS = symptoms.rows("rocm")


def row(url_tail: str) -> dict:
    return next(r for r in ROWS if r["url"].endswith(url_tail))


def parts(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(r.mode, dict(r.parts)) for r in rocm.read(text)]


# Modes the family leaves to the catalogue's patterns (tests/test_explain_catalogue.py names
# their symptoms through explain): an iGPU beside a discrete GPU is rocm.igpu-selected's `also`,
# which rank.py reads in the line and in the lines around it.
CATALOGUE_ONLY = {"rocm.igpu-selected", "rocm.clang-libstdcxx-headers-missing",
                  # GNU c++ refusing HIP flags: the compiler's words, read by the pattern
                  "rocm.hip-flags-to-gnu-compiler",
                  # clang's device-library ABI words and torch's amdsmi NameError: the words
                  "rocm.device-libs-abi-version-too-new", "rocm.amdsmi-python-missing",
                  # torch's own warning when it falls back to hipBLAS: a notice, read by the pattern
                  "rocm.hipblaslt-arch-fallback-benign", "rocm.ollama-amdgpu-version-missing-benign",
                  # the HSA runtime's own refusal of an older kernel driver: one wording
                  "rocm.userspace-newer-than-kfd",
                  # HIP's capture refusal raised in torch's watchdog thread: the words and the
                  # thread that raised them, read by the pattern
                  "rocm.hip-capture-watchdog-event-query",
                  # CMake's find_package words naming a ROCm component: read by the pattern
                  # (bare "hip" left out: ROCm 2.x/3.x packaging bugs said the same)
                  "rocm.cmake-package-config-missing",
                  # Windows' loader words for the AMD driver's HIP runtime (an entry point it
                  # lacks, an amdhip64_N.dll major not installed): read by the pattern
                  "rocm.windows-driver-hip-runtime-too-old", "rocm.windows-hip-runtime-major-missing"}


@pytest.mark.parametrize("symptom", [r for r in ROWS if r["mode"] not in CATALOGUE_ONLY],
                         ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_each_symptom_reads_as_its_mode(symptom):
    readings = rocm.read(symptom["text"])
    assert symptom["mode"] in [r.mode for r in readings], [r.mode for r in readings]
    assert all(r.family == "rocm" and r.text for r in readings)


def test_missing_code_object_names_the_gfx_target_and_the_override():
    mode, got = parts(row("pytorch/pytorch/issues/73534")["text"])[0]
    assert (mode, got["error"]) == ("gpu.rocm-gfx-unsupported", "hipErrorNoBinaryForGpu")
    mode, got = parts("RuntimeError: HIP error: invalid device function\n"
                      "GPU gfx1032:xnack- ... HSA_OVERRIDE_GFX_VERSION=10.3.0")[0]
    assert (mode, got["gfx"], got["override"]) == ("gpu.rocm-gfx-unsupported",
                                                   "gfx1032:xnack-", "10.3.0")


def test_rocblas_without_a_tensile_library_for_the_arch():
    mode, got = parts(row("brknsoul/ROCmLibs/issues/4")["text"])[0]
    assert (mode, got["gfx"]) == ("gpu.rocm-gfx-unsupported", "gfx1103")


def test_the_kfd_errno_decides():
    mode, got = parts(row("ROCm/ROCm-docker/issues/116")["text"])[0]
    assert (mode, got["errno"]) == ("rocm.kfd-permission-denied", "Permission denied")
    mode, got = parts(row("ollama/ollama/pull/6736")["text"])[0]
    assert mode == "rocm.kfd-permission-denied"
    # strace's form, ENOMEM: the KFD does not drive this GPU
    mode, got = parts('openat(AT_FDCWD, "/dev/kfd", O_RDWR|O_CLOEXEC) = -1 ENOMEM '
                      "(Cannot allocate memory)")[0]
    assert (mode, got["errno"]) == ("rocm.gpu-not-supported-by-kfd", "ENOMEM")
    # OUT_OF_RESOURCES with the user in the group: not permissions, an unsupported GPU
    assert [m for m, _ in parts(row("ROCm/rocminfo/issues/27")["text"])] == [
        "rocm.gpu-not-supported-by-kfd"]
    mode, got = parts("kfd kfd: amdgpu: PITCAIRN  not supported in kfd")[0]
    assert (mode, got["chip"]) == ("rocm.gpu-not-supported-by-kfd", "PITCAIRN")
    # ENOENT inside a container is the container family's (the device was not passed in)
    assert parts("Unable to open /dev/kfd read-write: No such file or directory") == []


def test_docker_without_a_kfd_on_the_host():
    mode, got = parts(row("hydrian/stable-diffusion-webui-rocm/issues/17")["text"])[0]
    assert (mode, got["device"]) == ("rocm.kfd-device-missing", "/dev/kfd")


def test_miopen_database_file_and_reason():
    mode, got = parts(row("ROCm/MIOpen/issues/1878")["text"])[0]
    assert (mode, got["reason"]) == ("cache.miopen-db-shared-fs",
                                     "database disk image is malformed")
    mode, got = parts(row("ROCm/MIOpen/issues/114")["text"])[0]
    assert got["database"] == "/public/home/facepp1/.config/miopen//gfx906_64.HIP.2_0_0.ufdb.txt"
    mode, got = parts("MIOpen Error: filesystem error: cannot create directories: Permission "
                      "denied [/tmp/miopen-cache/3.5.2.]")[0]
    assert (mode, got["database"], got["reason"]) == (
        "cache.miopen-db-shared-fs", "/tmp/miopen-cache/3.5.2.", "permission denied")


def test_amdgpu_ids_is_named_only_alone():
    assert [m for m, _ in parts("amdgpu.ids: No such file or directory")] == [
        "rocm.amdgpu-ids-missing-benign"]
    assert [m for m, _ in parts("amdgpu.ids: No such file or directory\n"
                                "RuntimeError: HIP error: invalid device function")] == [
        "gpu.rocm-gfx-unsupported"]


def test_miopen_missing_system_db_is_named_only_alone():
    mode, got = parts(row("ssube/onnx-web/issues/293")["text"])[0]
    assert (mode, got["database"]) == ("rocm.miopen-system-db-missing-benign",
                                       "gfx1030_40.kdb")
    assert [m for m, _ in parts(
        "MIOpen(HIP): Warning [SQLiteBase] Unable to read system database file:gfx906_60.kdb "
        "Performance may degrade\nMIOpen Error: /src/sqlite_db.cpp:229: Internal error while "
        "accessing SQLite database: locking protocol")] == ["cache.miopen-db-shared-fs"]


def test_other_families_and_empty_text_give_no_reading():
    assert rocm.read("") == []
    assert rocm.read("RuntimeError: CUDA error: no kernel image is available for execution "
                     "on the device") == []
    assert rocm.read("nvidia-container-cli: initialization error: load library failed: "
                     "libnvidia-ml.so.1: cannot open shared object file") == []
    assert rocm.read("misc/socket.cc:480 NCCL WARN socketStartConnect: Connect to "
                     "172.17.0.2<38847> failed : Software caused connection abort") == []


def test_pcie_atomics_outrank_the_out_of_resources_beside_them():
    mode, got = parts(row("ROCm/legacy-rocm-build/issues/827")["text"])[0]
    assert (mode, got["device"]) == ("rocm.pcie-atomics-missing", "1002:699f")
    # rocminfo's OUT_OF_RESOURCES (4104) next to the dmesg line is the atomics, not the ASIC
    assert [m for m, _ in parts(
        "Call returned HSA_STATUS_ERROR_OUT_OF_RESOURCES\n"
        "amdgpu: skipped device 1002:67df, PCI rejects atomics 730<0")] == [
        "rocm.pcie-atomics-missing"]


def test_driver_not_loaded_unless_built_in_or_wsl():
    mode, got = parts(row("PawseySC/rocm-from-source/issues/2")["text"])[0]
    assert (mode, got["error"]) == ("rocm.amdgpu-driver-not-loaded",
                                    "/sys/module/amdgpu/initstate: No such file")
    # amdgpu built into the kernel: the tool's module check is wrong, the driver is there
    assert "rocm.amdgpu-driver-not-loaded" not in [
        m for m, _ in parts("i have `amdgpu` built directly into the kernel\nERROR:root:Unable "
                            "to get devices, driver not initialized (amdgpu not found in modules)")]
    # under WSL2 there is no amdgpu module to load: AMD's WSL stack is the way
    mode, got = parts(row("ROCm/legacy-rocm-build/issues/1794")["text"])[0]
    assert (mode, got["platform"]) == ("rocm.wsl-needs-radeon-wheel", "WSL2")
    mode, got = parts("Python platform: Linux-6.6.87.1-microsoft-standard-WSL2-x86_64-with-glibc2.39"
                      "\nRuntimeError: No HIP GPUs are available")[0]
    assert (mode, got["error"]) == ("rocm.wsl-needs-radeon-wheel", "No HIP GPUs are available")
    mode, _ = parts(row("ROCm/legacy-rocm-build/issues/5900")["text"])[0]
    assert mode == "rocm.wsl-needs-radeon-wheel"
    # hipErrorNoDevice in HIP's own words (hipGetErrorString, as llama.cpp/ggml print it) is
    # the same error: read the same way beside a WSL kernel
    ggml = "ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected"
    mode, got = parts(f"Linux 6.6.87.2-microsoft-standard-WSL2\n{ggml}")[0]
    assert (mode, got["error"]) == ("rocm.wsl-needs-radeon-wheel",
                                    "no ROCm-capable device is detected")
    # No HIP GPUs without any WSL evidence names nothing: it has many causes (a render group
    # the container lacks, vllm#34573; amdgpu not bound under nomodeset,
    # kyuz0/amd-strix-halo-toolboxes#75)
    assert parts("RuntimeError: No HIP GPUs are available") == []
    assert parts(ggml) == []


def test_deepspeed_rocm_version_file():
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/2080")["text"])[0]
    assert (mode, got["version file"]) == ("rocm.deepspeed-rocm-version-undetected",
                                           "/opt/rocm/.info/version-dev")


def test_apptainer_bound_host_library():
    mode, got = parts(row("apptainer/apptainer/pull/1622")["text"])[0]
    assert (mode, got["library"]) == ("rocm.apptainer-rocm-binds-host-libs",
                                      "libhsa-runtime64.so.1")
    mode, got = parts(row("apptainer/apptainer/issues/1621")["text"])[0]
    assert got["library"] == "rocblas"
    # --nv binds land in the same folder: an NVIDIA library there is not this
    assert parts("version `GLIBC_2.34' not found (required by "
                 "/.singularity.d/libs/libcuda.so.1)") == []


def test_tensile_forms_name_the_missing_arch():
    mode, got = parts(row("ROCm/AMDMIGraphX/pull/3517")["text"])[0]
    assert (mode, got["gfx"]) == ("gpu.rocm-gfx-unsupported", "gfx1201")
    mode, got = parts(row("ollama/ollama/issues/12908")["text"])[0]
    assert (mode, got["gfx"]) == ("gpu.rocm-gfx-unsupported", "gfx1200")
    # the merged library unreadable under apptainer's bind folder (the host's rocBLAS) is not this
    assert "gpu.rocm-gfx-unsupported" not in [m for m, _ in parts(
        row("apptainer/apptainer/issues/1621")["text"])]
    # releases before ROCm 6 name no arch: the unreadable library is still read (AMD's answer
    # in legacy-rocm-build#2914: a GPU the release does not support); the group lists the other
    # cause (tests/test_explain_shared.py)
    assert [m for m, _ in parts("rocBLAS error: Cannot read /opt/rocm-5.4.0/lib/rocblas/library/"
                                "TensileLibrary.dat: Illegal seek")] == ["gpu.rocm-gfx-unsupported"]


def test_tensile_files_that_are_not_there():
    """rocBLAS's own evidence that its folder is empty, missing or not where it looked names
    the files, not the target; a list of other targets' files names the target; a list that
    holds the GPU's own target names neither; a paste cut after the list's header says
    nothing of the folder."""
    mode, got = parts(row("vladmandic/sdnext/issues/4737")["text"])[0]
    assert (mode, got["gfx"]) == ("rocm.rocblas-tensile-files-missing", "gfx1201")
    assert "directory iterator" in got["library"]
    mode, got = parts(row("justxi/rocm/issues/182")["text"])[0]
    assert mode == "rocm.rocblas-tensile-files-missing" and "No paths matched" in got["library"]
    listed = row("ROCm/AMDMIGraphX/pull/3517")["text"]
    mode, got = parts(listed)[0]
    assert mode == "gpu.rocm-gfx-unsupported" and "gfx942" in got["library has"]
    own = listed.replace("gfx1201", "gfx1100")  # the list holds TensileLibrary_lazy_gfx1100.dat
    assert parts(own) == []
    cut = listed.split("\n")[0] + "\n List of available TensileLibrary Files :"
    assert [m for m, _ in parts(cut)] == ["gpu.rocm-gfx-unsupported"]


def test_device_libraries_and_execstack():
    assert [m for m, _ in parts(row("ROCm/ROCm-Device-Libs/issues/81")["text"])] == [
        "rocm.device-libs-not-found"]
    assert [m for m, _ in parts("clang-11: error: cannot find ROCm installation.  Provide its "
                                "path via --rocm-path, or pass -nogpulib.")] == [
        "rocm.device-libs-not-found"]
    mode, got = parts(row("CarlGao4/Demucs-Gui/issues/151")["text"])[0]
    assert (mode, got["library"]) == ("rocm.hip-lib-execstack", "libamdhip64.so")
    # another program's library refused by the same glibc is not ROCm's
    assert parts("libctranslate2-bc15bf3f.so.4.5.0: cannot enable executable stack as shared "
                 "object requires: Invalid argument") == []


def test_wsl_runtime_refusing_the_gpu():
    mode, got = parts(row("ROCm/legacy-rocm-build/issues/4215")["text"])[0]
    assert (mode, got["error"]) == ("rocm.wsl-gpu-unsupported", "ROCR: unsupported GPU")
    # no GPU under WSL on an RDNA2 Radeon: the WSL stack does not drive that generation
    mode, got = parts("GPU: AMD Radeon RX 6800 XT (WSL2)\n"
                      "RuntimeError: No HIP GPUs are available")[0]
    assert (mode, got["gpu"]) == ("rocm.wsl-gpu-unsupported", "RX 6800")
    # the same words on a GPU the WSL matrix lists stay the WSL-stack mode
    assert [m for m, _ in parts("GPU: AMD Radeon RX 7900 XTX (WSL2)\n"
                                "RuntimeError: No HIP GPUs are available")] == [
        "rocm.wsl-needs-radeon-wheel"]


def test_extension_arch_allow_list_names_the_rejected_target():
    mode, got = parts(row("ROCm/flash-attention/issues/93")["text"])[0]
    assert (mode, got["archs"]) == ("rocm.flash-attn-arch-list", "gfx1100")
    mode, got = parts("AssertionError: One of GPU archs of ['gfx908'] is invalid or not "
                      "supported by Flash-Attention")[0]
    assert (mode, got["archs"]) == ("rocm.flash-attn-arch-list", "'gfx908'")


def test_bitsandbytes_library_tag_on_windows_and_wrapped_lines():
    mode, got = parts("bitsandbytes library load error: Configured ROCm binary not found at "
                      "F:\\venv\\Lib\\site-packages\\bitsandbytes\\libbitsandbytes_rocm71.dll")[0]
    assert mode == "rocm.bnb-binary-version-tag"
    assert parts("RuntimeError: Configured ROCm binary not found at \n/home/u/.local/lib/"
                 "python3.14/site-packages/bitsandbytes/libbitsandbytes_rocm72.so")[0][0] == \
        "rocm.bnb-binary-version-tag"
    # earlier ROCm builds warned in cextension.py's other wording, then fell back to the CPU
    # library: the tag is read there too (the CPU library's load failure after it is the fallback)
    mode, got = parts("Could not find the bitsandbytes ROCm binary at PosixPath('/opt/venv/lib/"
                      "python3.12/site-packages/bitsandbytes/libbitsandbytes_rocm63.so')")[0]
    assert (mode, got["asked for"]) == ("rocm.bnb-binary-version-tag", "libbitsandbytes_rocm63")
    # CUDA's wording of the same warning is bitsandbytes' CUDA mode, not ROCm's
    assert parts("Could not find the bitsandbytes CUDA binary at PosixPath('/opt/venv/lib/"
                 "python3.12/site-packages/bitsandbytes/libbitsandbytes_cuda121.so')") == []


def test_missing_code_object_with_an_igpu_beside_a_discrete_gpu_names_the_igpu():
    from dsenv.doctor.explain.command import explain_text
    alone = "RuntimeError: HIP error: invalid device function"
    assert [m.id for m in explain_text(alone)[2]][:1] == ["gpu.rocm-gfx-unsupported"]
    # an APU's integrated GPU beside the discrete one: HIP picked the iGPU, so the gfx list of
    # the build is not the cause, and hiding the iGPU is the fix
    both = ("CPU: AMD Ryzen 5 3600G with Radeon Vega Graphics\nGPU: AMD Radeon RX 6700 XT\n"
            "RuntimeError: HIP error: invalid device function")
    named = [m.id for m in explain_text(both)[2]]
    assert named[:1] == ["rocm.igpu-selected"] and "gpu.rocm-gfx-unsupported" not in named
    # the iGPU evidence a few lines above the failing line of a log (the mode's `also`)
    log = ("CPU: AMD Ryzen 5 3600G with Radeon Vega Graphics\nGPU: AMD Radeon RX 6700 XT\n"
           "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
           "    x = torch.ones(3).cuda() * 2\nRuntimeError: HIP error: invalid device function")
    assert [m.id for m in explain_text(log)[2]][:1] == ["rocm.igpu-selected"]
    # ggml's device list: the iGPU by its marketing name, the failing device beside a Radeon card
    ggml = ("ggml_cuda_init: found 2 ROCm devices:\n  Device 0: AMD Radeon RX 9070, gfx1201\n"
            "  Device 1: AMD Radeon 740M Graphics, gfx1103\nggml_cuda_compute_forward: MUL_MAT "
            "failed\nROCm error: invalid device function\n  current device: 1")
    assert [m.id for m in explain_text(ggml)[2]][:1] == ["rocm.igpu-selected"]
    # HIP's hipErrorNoBinaryForGpu in CUDA's words: the CUDA modes that share those words step
    # back for "HIP error:", so the iGPU beside the card is named, not an extension's arch list
    cuda_words = ("RuntimeError: HIP error: no kernel image is available for execution on the "
                  "device\nDevice 0: AMD Radeon(TM) Graphics, gfx1036 (iGPU)\n"
                  "Device 1: AMD Radeon RX 7900 XTX, gfx1100")
    named = [m.id for m in explain_text(cuda_words)[2]]
    assert named[:1] == ["rocm.igpu-selected"] and "torch.arch-list-misses-gpu" not in named
    # an APU alone (no discrete GPU) is the build's gfx list: nothing else to select
    apu = ("CPU: AMD Ryzen 7 5700U with Radeon Graphics\n"
           "RuntimeError: HIP error: invalid device function")
    assert [m for m, _ in parts(apu)] == ["gpu.rocm-gfx-unsupported"]
    assert [m.id for m in explain_text(apu)[2]][:1] == ["gpu.rocm-gfx-unsupported"]


def test_the_igpu_evidence_is_one_pattern_in_both_modes():
    # gpu.rocm-gfx-unsupported steps back exactly where rocm.igpu-selected steps in
    from dsenv.doctor import catalogue
    assert catalogue.mode("gpu.rocm-gfx-unsupported").against == \
        catalogue.mode("rocm.igpu-selected").also


def test_hip_words_for_a_missing_code_object_are_rocms():
    from dsenv.doctor.explain.command import explain_text
    for text in ("RuntimeError: HIP error: no kernel image is available for execution on the "
                 "device",
                 "torch.AcceleratorError: HIP error: device kernel image is invalid\nSearch for "
                 "`hipErrorInvalidImage' in https://rocm.docs.amd.com/ for more information."):
        assert [m for m, _ in parts(text)] == ["gpu.rocm-gfx-unsupported"]
        assert [m.id for m in explain_text(text)[2]][:1] == ["gpu.rocm-gfx-unsupported"]
    # CUDA's own "no kernel image" stays the CUDA modes'
    assert parts("RuntimeError: CUDA error: no kernel image is available for execution on the "
                 "device") == []


def test_hipcc_looking_for_clang_where_rocm_is_not():
    mode, got = parts(row("ROCm/legacy-rocm-build/issues/1231")["text"])[0]
    assert (mode, got["looked for"], got["by"]) == (
        "rocm.hip-env-not-loaded", "/opt/rocm/llvm/bin/clang++", "/opt/rocm-3.8.0/bin/hipconfig")
    mode, got = parts(row("ROCm/legacy-rocm-build/issues/1140")["text"])[0]
    assert got["looked for"] == "/opt/rocm/hcc/bin/hcc"
    # another tool hipcc could not run is not its compiler path
    assert parts("Can't exec \"/opt/rocm/bin/rocm_agent_enumerator\": No such file or directory "
                 "at /opt/hip/bin/hipcc line 592.") == []


def test_ray_and_verl_refusing_rocr_visible_devices():
    for text in (row("ray-project/ray/issues/52701")["text"],
                 row("lumi-ai-factory/laifs-container-recipes/issues/6")["text"],
                 "ValueError: Please don't set ROCR_VISIBLE_DEVICES when HIP/CUDA_VISIBLE_DEVICES "
                 "is set."):
        assert [m for m, _ in parts(text)] == ["rocm.visible-devices-conflict"]


def test_clang_without_the_hip_runtime():
    for tail in ("legacy-rocm-build/pull/4025", "legacy-rocm-build/issues/3380"):
        assert [m for m, _ in parts(row(tail)["text"])] == ["rocm.hip-runtime-not-found"]
    # the device libraries missing is the sister mode, not this one
    assert [m for m, _ in parts("clang: error: cannot find ROCm device library; provide its path "
                                "via '--rocm-path' or '--rocm-device-lib-path', or pass "
                                "'-nogpulib' to build without ROCm device library")] == [
        "rocm.device-libs-not-found"]
    # a HIP runtime *error* at run time is no compile missing the runtime
    assert parts("RuntimeError: HIP error: out of memory") == []


def test_dkms_stopping_on_a_left_over_version_folder():
    mode, got = parts(row("legacy-rocm-build/issues/3608")["text"])[0]
    assert (mode, got["module"], got["version"], got["folder"]) == (
        "rocm.dkms-stale-module-tree", "amdgpu", "6.7.0-1756574.22.04",
        "/var/lib/dkms/amdgpu/6.7.0-1756574.22.04")
    mode, got = parts(row("legacy-rocm-build/issues/3701")["text"])[0]
    assert got["version"] == "6.7.0-1787201.22.04"
    # a healthy dkms status names no folder
    assert parts("amdgpu/6.16.6-2255209.24.04, 6.17.0-8-generic, x86_64: installed") == []


def test_lazy_tensile_library_under_a_path_with_spaces():
    text = ("rocBLAS error: Could not load C:\\Program Files\\AMD\\ROCm\\6.1\\bin\\/rocblas/library/"
            "TensileLibrary_lazy_gfx1103.dat\n\nrocBLAS error: Could not initialize Tensile library")
    mode, got = parts(text)[0]
    assert (mode, got["gfx"]) == ("gpu.rocm-gfx-unsupported", "gfx1103")


def test_hips_own_no_code_object_line_names_the_gpus_target():
    """hip_fatbin.cpp's log line (before the segfault of an app that never checks the error)
    carries the target the build lacks, in its older and its ROCm 7 wording."""
    mode, got = parts(row("ggml-org/llama.cpp/issues/19949")["text"])[0]
    assert (mode, got["gfx"]) == ("gpu.rocm-gfx-unsupported", "gfx1152")
    newer = ("No compatible code objects with HIP_FORCE_SPIRV_CODEOBJECT: 0. Rebuild the "
             "application with option --offload-arch=gfx1201")
    assert parts(newer)[0][1]["gfx"] == "gfx1201"
    assert parts("No compatible code objects found for: %s, value of HIP_FORCE_SPIRV") == []
