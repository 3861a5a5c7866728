"""The GPU / driver / CUDA runtime / torch build family parser (doctor/explain/families/gpu.py)
on the real texts of tests/fixtures/explain_symptoms/gpu.jsonl: each is read into its parts and
the mode its thread established; texts of other families and empty text give no reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsenv.doctor.explain.families import gpu
from tests.harness import symptoms

ROWS = symptoms.rows("gpu")


def row(url_tail: str) -> dict:
    return next(r for r in ROWS if r["url"].endswith(url_tail))


def parts(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(r.mode, dict(r.parts)) for r in gpu.read(text)]


@pytest.mark.parametrize("symptom", ROWS, ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_each_symptom_reads_as_its_mode(symptom):
    readings = gpu.read(symptom["text"])
    assert readings and readings[0].mode == symptom["mode"], [r.mode for r in readings]
    assert readings[0].family == "gpu" and readings[0].text


def test_gpu_arch_newer_than_the_build_list():
    mode, got = parts(row("lucasxlu/ComboLoss/issues/3")["text"])[0]
    assert mode == "gpu.torch-build-lacks-arch"
    assert got["gpu"] == "NVIDIA GeForce RTX 3080 Laptop GPU" and got["arch"] == "sm_86"
    assert got["build supports"] == "sm_37 sm_50 sm_60 sm_70"


def test_gpu_arch_below_the_build_list_is_too_old():
    # The same warning with a GPU below every arch the wheel has is the GPU's age, not the build.
    text = ("Tesla K40m with CUDA capability sm_35 is not compatible with the current PyTorch "
            "installation.\nThe current PyTorch install supports CUDA capabilities sm_50 sm_60 "
            "sm_70 sm_75 sm_80 sm_86 sm_90.")
    mode, got = parts(text)[0]
    assert (mode, got["arch"]) == ("gpu.too-old-for-torch", "sm_35")


def test_list_reading_compares_the_numbers():
    # torch 2.7+cu128 on a Pascal card: sm_61 is below the list's sm_75, so the GPU is too old.
    text = ("NVIDIA GeForce GTX 1080 Ti with CUDA capability sm_61 is not compatible with the "
            "current PyTorch installation.\nThe current PyTorch install supports CUDA "
            "capabilities sm_75 sm_80 sm_86 sm_90 sm_100 sm_120.")
    assert parts(text)[0][0] == "gpu.too-old-for-torch"


def test_warning_without_the_list_reads_the_arch_alone():
    # Only torch's first line pasted (exllamav2#786): a GPU below Volta that a build flags was
    # dropped by it (cu128+ wheels), so it is the GPU's age; a newer GPU is the build's top.
    old = row("turboderp-org/exllamav2/issues/786")["text"]
    mode, got = parts(old)[0]
    assert (mode, got["arch"], got["build supports"]) == ("gpu.too-old-for-torch", "sm_61", "")
    new = ("NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the "
           "current PyTorch installation.")
    assert parts(new)[0][0] == "gpu.torch-build-lacks-arch"


def test_warning_wrapped_across_lines_is_read():
    # A pasted log wrapping torch's line after "current" (Whisper-WebUI#653) is the same warning.
    mode, got = parts(row("jhj0517/Whisper-WebUI/issues/653")["text"])[0]
    assert (mode, got["arch"]) == ("gpu.too-old-for-torch", "sm_61")
    assert got["build supports"].startswith("sm_70 sm_75 sm_80")


def test_arch_in_the_list_is_not_the_failure():
    # The healthy twin: the build lists the GPU's arch, so the warning is not this failure.
    text = ("Tesla P100-PCIE-16GB with CUDA capability sm_60 is not compatible with the current\n"
            "PyTorch installation.\nThe current PyTorch install supports CUDA capabilities "
            "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.")
    assert not any(m.startswith("gpu.") for m, _ in parts(text))


@pytest.mark.parametrize("cc, lo, hi, mode", [
    ("5.2", "7.5", "12.0", "gpu.too-old-for-torch"),  # below the build's floor
    ("12.0", "5.0", "9.0", "gpu.torch-build-lacks-arch"),  # a newer major than its top
    ("8.9", "8.9", "9.0", None),  # inside the range: torch's false warning (pytorch#164708)
    ("12.1", "8.0", "12.0", None),  # a newer minor of the top major runs its kernels
])
def test_range_wording_compares_capability_with_the_range(cc, lo, hi, mode):
    text = (f"UserWarning:\n    Found GPU0 NVIDIA X which is of cuda capability {cc}.\n"
            "    Minimum and Maximum cuda capability supported by this version of PyTorch is\n"
            f"    ({lo}) - ({hi})\n")
    got = parts(text)
    assert (got[0][0] if got else None) == mode
    if got:
        assert got[0][1]["capability"] == cc and got[0][1]["build supports"] == f"{lo} - {hi}"


def test_too_old_warning_names_gpu_and_capability():
    mode, got = parts(row("w-okada/voice-changer/issues/447")["text"])[0]
    assert (mode, got["gpu"], got["capability"]) == ("gpu.too-old-for-torch", "GeForce GT 720",
                                                     "3.5")


def test_no_kernel_image_in_an_extension_is_its_arch_list():
    mode, got = parts(row("open-mmlab/mmcv/issues/2201")["text"])[0]
    assert mode == "torch.arch-list-misses-gpu" and got["extension"] == "mmcv"
    # an extension module's own call (not torch._C) in the frame above the error
    mode, got = parts("    out = flash_attn_cuda.fwd(\nRuntimeError: CUDA error: no kernel image "
                      "is available for execution on the device")[0]
    assert (mode, got["extension"]) == ("torch.arch-list-misses-gpu", "flash_attn_cuda.fwd(")
    # plain torch failing: the wheel lacks the GPU
    mode, _ = parts("RuntimeError: CUDA error: no kernel image is available for execution on "
                    "the device")[0]
    assert mode == "gpu.torch-build-lacks-arch"
    mode, _ = parts("    torch._C._cuda_init()\nRuntimeError: CUDA error: no kernel image is "
                    "available for execution on the device")[0]
    assert mode == "gpu.torch-build-lacks-arch"
    # a DeepSpeed op: the build family's, not read here
    assert gpu.read("deepspeed/ops/adam/fused_adam.py ... RuntimeError: CUDA error: no kernel "
                    "image is available for execution on the device") == []


def test_driver_version_is_decoded():
    mode, got = parts(row("zai-org/ChatGLM3/issues/100")["text"])[0]
    assert (mode, got["driver supports cuda"]) == ("gpu.driver-too-old", "11.6")


def test_error_numbers_in_wrapper_frames():
    mode, got = parts(row("charmplusplus/charm/issues/802")["text"])[0]
    assert (mode, got["code"]) == ("gpu.exclusive-process-mode", "46")
    mode, got = parts(row("pytorch/pytorch/issues/35710")["text"])[0]
    assert (mode, got["code"]) == ("gpu.fabric-manager-not-running", "802")
    mode, got = parts(row("mit-han-lab/inter-operator-scheduler/issues/4")["text"])[0]
    assert (mode, got["code"]) == ("gpu.ptx-newer-than-driver", "222")
    # a number outside a CUDA frame is not a CUDA error
    assert gpu.read("Epoch 46 finished, loss 0.802") == []


def test_deepspeed_runner_include_and_slot():
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/4248")["text"])[0]
    assert (mode, got["visible"], got["include"]) == ("gpu.visible-devices-remapped", "2",
                                                      "localhost:2")
    mode, got = parts(row("CASIA-LMC-Lab/AnomalyGPT/issues/29")["text"])[0]
    assert (got["slot"], got["host"]) == ("5", "localhost")


def test_xid_and_nvml():
    mode, got = parts(row("NVIDIA/open-gpu-kernel-modules/issues/1151")["text"])[0]
    assert (mode, got["xid"], got["pci"]) == ("gpu.fallen-off-bus", "79", "0000:06:00")
    mode, got = parts(row("intel/llvm/issues/17614")["text"])[0]
    assert (mode, got["nvml library"]) == ("gpu.driver-library-mismatch", "550.144")


def test_no_nccl_build_says_the_platform():
    mode, got = parts(row("bshall/hubert/issues/1")["text"])[0]
    assert (mode, got["platform"]) == ("torch.no-nccl-in-build", "windows")


def test_container_texts_are_left_to_the_container_family():
    text = ("Singularity> python -c 'import torch; torch.cuda.init()'\nRuntimeError: Found no "
            "NVIDIA driver on your system.")
    assert gpu.read(text) == []


@pytest.mark.parametrize("text", [
    "include/socket.h:344 WARN Socket creation failed : Address family not supported by protocol",
    "ImportError: libcudart.so.10.1: cannot open shared object file: No such file or directory",
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB",
    "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0.",
    # a CUDA error of another kind first: the 'invalid device ordinal' after it is a consequence
    "enqueue.cc:802 NCCL WARN Cuda failure 'API call is not supported in the installed CUDA "
    "driver'\ninit.cc:895 NCCL WARN Cuda failure 'invalid device ordinal'",
])
def test_other_families_give_no_reading(text):
    assert gpu.read(text) == []


def test_empty_text_gives_no_reading():
    assert gpu.read("") == []


def test_out_of_memory_is_another_process_only_when_this_one_holds_little():
    """torch's OOM report says how much this process holds: 0.5 of 11.2 GiB with 12.5 MiB
    free (the symptom) is memory held elsewhere; a batch too large fills the GPU itself (the
    corpus's NOT-ENVIRONMENT messages from chnsh/DCRNN_PyTorch#6 and deepseek-ai/
    DeepSeek-Coder#78, as posted) and gives no reading. The newer wording is read the same
    way (its figures here: this process 1.2 of 79 GiB)."""
    mode, got = parts(row("pytorch/pytorch/issues/40863")["text"])[0]
    assert mode == "gpu.memory-held-by-other-process"
    assert (got["this process"], got["free"], got["held elsewhere"]) == (
        "530.00 MiB", "12.50 MiB", "10.64 GiB")
    for text in ("RuntimeError:CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.80 GiB "
                 "total capacity; 4.36 GiB already allocated; 6.69 MiB free; 4.63 GiB reserved "
                 "in total by PyTorch)",
                 "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB "
                 "(GPU 3; 79.35 GiB total capacity; 77.08 GiB already allocated; 415.19 MiB "
                 "free; 77.54 GiB reserved in total by PyTorch)"):
        assert not parts(text), text
    newer = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
             "a total capacity of 79.10 GiB of which 12.56 MiB is free. Process 3721648 has "
             "77.80 GiB memory in use. Including non-PyTorch memory, this process has 1.20 GiB "
             "memory in use.")
    assert parts(newer)[0][0] == "gpu.memory-held-by-other-process"
    assert not parts(newer.replace("this process has 1.20 GiB", "this process has 78.90 GiB"))


def test_cublas_refusing_a_bf16_gemm_is_a_gpu_without_bf16():
    """CUBLAS_STATUS_NOT_SUPPORTED says little alone; bfloat16 operands in the call it names
    (CUDA_R_16BF, as on the M40 at opendatalab/MinerU#1508) make it the GPU's missing bf16.
    The same status for an fp16 GEMM (CUDA_R_16F, as posted at buaacyw/GaussianEditor#46)
    gives no reading."""
    text = next(r["text"] for r in symptoms.rows("system")
                if r["url"].endswith("opendatalab/MinerU/issues/1508"))
    mode, got = parts(text)[0]
    assert (mode, got["call"], got["dtype"]) == ("job.bf16-unsupported-gpu",
                                                 "cublasGemmStridedBatchedEx", "CUDA_R_16BF")
    fp16 = ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( "
            "handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, &fbeta, "
            "c, CUDA_R_16F, ldc, CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`")
    assert not parts(fp16)


def test_xla_warning_reads_the_driver_and_ptx_compiler_versions():
    # Both wordings XLA used across releases; a pasted log may wrap the version.
    for url, driver, ptxas in (("jax-ml/jax/issues/19821", "12.2", "12.3.107"),
                               ("conda-forge/tensorflow-feedstock/issues/417", "12.4", "12.5.82"),
                               ("YoshitakaMo/localcolabfold/issues/126", "11.0", "11.6.124")):
        text = next(r["text"] for r in ROWS if r["url"].endswith(url))
        got = [r for r in gpu.read(text) if r.mode == "gpu.ptx-newer-than-driver"]
        assert got, url
        parts = dict(got[0].parts)
        assert (parts["driver supports cuda"], parts["ptx compiler"]) == (driver, ptxas), parts


def test_invalid_device_function_is_a_kernel_without_code_for_the_gpu():
    """CUDA's older words for 'no kernel image' (error 8 before CUDA 10.1, 98 after): the THC
    frame and the RuntimeError of pytorch#1557 (torch built on another node's GPU) name the
    torch build; in an extension's op it is the extension's arch list; HIP's and ggml's words
    (ROCm builds, llama.cpp's own) are not torch's build and give no reading here."""
    mode, got = parts(row("pytorch/pytorch/issues/1557")["text"])[0]
    assert (mode, got["error"]) == ("gpu.torch-build-lacks-arch", "invalid device function")
    code = "THCudaCheck FAIL file=/src/emd_kernel.cu line=190 error=98 : invalid device function"
    assert parts(code)[0][0] == "gpu.torch-build-lacks-arch"
    ext = ("  File \"emd.py\", line 11, in forward\n    match = emd_cuda.approxmatch_forward(xyz1, "
           "xyz2)\nRuntimeError: cuda runtime error (98) : invalid device function at "
           "/src/emd_kernel.cu:190")
    assert parts(ext)[0][0] == "torch.arch-list-misses-gpu"
    for other in ("RuntimeError: HIP error: invalid device function",
                  "ggml_cuda_compute_forward: RMS_NORM failed\nCUDA error: invalid device function"
                  "\n  current device: 0, in function ggml_cuda_compute_forward at "
                  "ggml/src/ggml-cuda.cu:2288"):
        assert not parts(other), other
    # torch's own verdict beside it still decides: a GPU below the build's floor
    old = ("Found GPU0 GeForce 920MX which is of cuda capability 5.0.\n    PyTorch no longer "
           "supports this GPU because it is too old.\nRuntimeError: cuda runtime error (8) : "
           "invalid device function at /opt/conda/THCTensorMathPairwise.cu:102")
    assert parts(old)[0][0] == "gpu.too-old-for-torch"


def test_nvrtc_refusing_the_arch_is_a_torch_older_than_the_gpu():
    mode, got = parts(row("StelaBou/HyperReenact/issues/7")["text"])[0]
    assert mode == "gpu.torch-build-lacks-arch" and got["compiler"].startswith("NVRTC")
    # CuPy's own NVRTC refusing the arch is CuPy's CUDA, not torch's
    cupy = ("cupy.cuda.compiler.CompileException: nvrtc: error: invalid value for "
            "--gpu-architecture (-arch)")
    assert not parts(cupy)


def test_triton_image_invalid_is_its_ptxas_newer_than_the_driver():
    mode, got = parts(row("triton-lang/triton/issues/2971")["text"])[0]
    assert (mode, got["compiler"]) == ("gpu.ptx-newer-than-driver", "Triton's bundled ptxas")
    # HIP's own 'device kernel image is invalid' is the rocm family's; plain CUDA's wording
    # (a flash-attn wheel built for another torch, verl-project/verl#5876) is not Triton's
    assert not parts("RuntimeError: HIP error: device kernel image is invalid")
    assert not parts("torch.AcceleratorError: CUDA error: device kernel image is invalid")


def test_a_cuda_collect_env_beside_no_kernel_image_is_still_torch():
    # collect_env prints a ROCm line on every build; on a CUDA build it says N/A
    text = ("ROCM used to build PyTorch: N/A\nRuntimeError: CUDA error: no kernel image is "
            "available for execution on the device")
    assert parts(text)[0][0] == "gpu.torch-build-lacks-arch"
    rocm = ("ROCM used to build PyTorch: 6.4.43482-0f2d60242\nRuntimeError: CUDA error: invalid "
            "device function")
    assert not parts(rocm)


def test_driver_api_error_34_is_the_stub_libcuda():
    # numba's CudaAPIError and Warp's "(CUDA error 34)" are the driver API's numbers.
    mode, got = parts(row("numba/numba/issues/9732")["text"])[0]
    assert (mode, got["code"]) == ("gpu.libcuda-stub-loaded", "34")
    assert got["loaded"] == "/usr/local/cuda-11.8/targets/x86_64-linux/lib/stubs/libcuda.so"
    mode, got = parts(row("NVIDIA/warp/issues/219")["text"])[0]
    assert (mode, got["code"]) == ("gpu.libcuda-stub-loaded", "34")
    assert parts("CUDA API Error at line 28: CUDA driver is a stub library")[0][0] == \
        "gpu.libcuda-stub-loaded"


@pytest.mark.parametrize("text", [
    # Other driver errors in the same frames, and torch's old runtime 34 (cudaErrorNotReady).
    "numba.cuda.cudadrv.driver.CudaAPIError: [100] Call to cuInit results in CUDA_ERROR_NO_DEVICE",
    "Warp CUDA error: Failed to get driver entry point 'cuDeviceGetUuid' (CUDA error 1)",
    "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 error=34 : ...",
])
def test_other_numbers_are_not_the_stub(text):
    assert "gpu.libcuda-stub-loaded" not in [m for m, _ in parts(text)]


def test_error_803_with_a_compat_libcuda_on_the_path():
    mode, got = parts(row("vllm-project/vllm/pull/33116")["text"])[0]
    assert (mode, got["code"], got["compat library"]) == \
        ("gpu.compat-libcuda-mismatch", "803", "cuda compat")
    mode, got = parts(row("ggml-org/llama.cpp/issues/17542")["text"])[0]
    assert (mode, got["compat library"]) == ("gpu.compat-libcuda-mismatch", "cuda-compat-12.9")
    text = ("LD_LIBRARY_PATH=/usr/local/cuda-12.9/compat:/usr/lib64\nCUDA: Check failed: e == "
            "cudaSuccess (803 vs. 0) : system has unsupported display driver / cuda driver "
            "combination")
    assert parts(text)[0][1]["compat library"].endswith("/usr/local/cuda-12.9/compat")


@pytest.mark.parametrize("text, modes", [
    # A bare 803 is read as what NVIDIA documents it to be, the kernel module and libcuda out
    # of step; explain lists the compat libcuda and a driver too old with it (alternatives.toml
    # cuda-driver-mismatch, tests/test_explain_shared.py).
    ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
     "before calling NumCudaDevices() that might have already set an error? Error 803: system "
     "has unsupported display driver / cuda driver combination", ["gpu.driver-library-mismatch"]),
    # Another CUDA error is not this one.
    ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
     "before calling NumCudaDevices() that might have already set an error? Error 802: system "
     "not yet initialized", ["gpu.fabric-manager-not-running"]),
    # NVML saying the library and the module differ: a driver updated without a reboot.
    ("Failed to initialize NVML: Driver/library version mismatch\nError 803: system has "
     "unsupported display driver / cuda driver combination /usr/local/cuda/compat",
     ["gpu.driver-library-mismatch"]),
    # 804 stays forward compatibility on a GPU without it.
    ("Error 804: forward compatibility was attempted on non supported HW",
     ["gpu.forward-compat-unsupported"]),
])
def test_error_803_without_the_compat_library_is_not_this_mode(text, modes):
    assert [m for m, _ in parts(text)] == modes


def test_torchs_verdict_around_the_error_is_read_with_it():
    """torch prints "sm_61 is not compatible ... supports sm_70 ..." once, at the first CUDA
    call, away from the "no kernel image" error it explains (Whisper-WebUI#653, verbatim): the
    family reads it from the lines around; with nothing around it the error alone is torch's
    build; a verdict whose arch the build lists is not this failure."""
    url, _, text = (Path(__file__).parent / "fixtures" / "explain"
                    / "torch_sm61_warning_above_whisper_653.log").read_text().partition("\n")
    error, _, around = text.partition("\n\n")
    error = " ".join(error.split())  # as logread joins a wrapped message
    assert "no kernel image" in error and "sm_61 is not compatible" in around
    got = {r.mode: dict(r.parts) for r in gpu.read(error, around)}
    assert got["gpu.too-old-for-torch"]["arch"] == "sm_61"
    assert got["gpu.too-old-for-torch"]["build supports"].startswith("sm_70 sm_75")
    assert [r.mode for r in gpu.read(error)] == ["gpu.torch-build-lacks-arch"]
    listed = around.replace("sm_70 sm_75", "sm_61 sm_70 sm_75")
    assert "gpu.too-old-for-torch" not in [r.mode for r in gpu.read(error, listed)]


ASSERT_NUM_GPUS = ('RuntimeError: device >= 0 && device < num_gpus INTERNAL ASSERT FAILED at '
                   '"../aten/src/ATen/cuda/CUDAContext.cpp":50, please report a bug to PyTorch.')
SMI_MIG = ("|                                         |                        |               MIG M. |\n"
           "|=========================================+========================+======================|\n"
           "|   0  NVIDIA A100-SXM4-80GB          Off |   00000000:01:00.0 Off |                   On |\n"
           "|                                         |                        |              {} |")


def test_a_second_device_on_mig_instances_names_one_instance_per_process():
    """With MIG on, a process sees one MIG instance: torch's num_gpus assert or an invalid
    device ordinal beside MIG evidence (a MIG profile, nvidia-smi's MIG M. Enabled pasted
    around it) is that; without it the assert has another settled cause (torch counting the
    GPUs before the script narrowed CUDA_VISIBLE_DEVICES, pytorch/pytorch#126344), and the
    ordinal stays the launch's mismatch."""
    mig = "gpu.mig-one-instance-per-process"
    assert [m for m, _ in parts(f"{ASSERT_NUM_GPUS} on NVIDIA-A100-SXM4-80GB-MIG-3g.40gb")] == [mig]
    got = gpu.read(ASSERT_NUM_GPUS, around=SMI_MIG.format("Enabled"))
    assert [r.mode for r in got] == [mig] and dict(got[0].parts)["mig"].startswith("MIG M.")
    assert [m for m, _ in parts("RuntimeError: CUDA error: invalid device ordinal\n"
                                "CUDA_VISIBLE_DEVICES=MIG-0e2b3a1f-5c1d-5e0a-9c7e-1f2a3b4c5d6e")] \
        == [mig]
    # twins: no MIG, or the MIG column saying Disabled, is the count taken before the change
    other = ["gpu.visible-devices-changed-after-count"]
    assert [m for m, _ in parts(ASSERT_NUM_GPUS)] == other
    assert [r.mode for r in gpu.read(ASSERT_NUM_GPUS, around=SMI_MIG.format("Disabled"))] == other
    assert [m for m, _ in parts("RuntimeError: CUDA error: invalid device ordinal")] == [
        "gpu.visible-devices-remapped"]


def test_out_of_memory_counts_sizes_torch_prints_in_bytes():
    """torch prints sizes under 1 KiB as "N bytes": a process that holds nothing while the GPU
    is full is the clearest case of memory held elsewhere; the twin, a process that filled the
    GPU itself with nothing free, is the batch's own; an OOM line without the sizes reads none."""
    elsewhere = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; "
                 "10.76 GiB total capacity; 0 bytes already allocated; 5.94 MiB free; 0 bytes "
                 "reserved in total by PyTorch)")
    (mode, got), = [(m, g) for m, g in parts(elsewhere) if m == "gpu.memory-held-by-other-process"]
    assert got["this process"] == "0 bytes" and got["free"] == "5.94 MiB"
    assert got["held elsewhere"] == "10.75 GiB"
    itself = elsewhere.replace("0 bytes already allocated; 5.94 MiB free; 0 bytes",
                               "10.50 GiB already allocated; 0 bytes free; 10.60 GiB")
    assert "gpu.memory-held-by-other-process" not in [m for m, _ in parts(itself)]
    assert parts("torch.OutOfMemoryError: CUDA out of memory.") == []


def test_cublas_refusing_the_device_is_a_gpu_too_old_for_the_call():
    """ARCH_MISMATCH from cuBLAS or cuDNN on a K80 (Kaldi prints its capability, 3.7, on the
    device line: alphacep/vosk-api#665) is the GPU's age; the same status where the GPU is
    printed at 5.0 or above, or where the failed call has fp16 operands (the Quadro M6000 at
    mit-han-lab/bevfusion#615, fixed by another CUDA release), gives no reading."""
    mode, got = parts(row("alphacep/vosk-api/issues/665")["text"])[0]
    assert (mode, got["status"], got["capability"]) == (
        "gpu.too-old-for-cuda-library", "CUBLAS_STATUS_ARCH_MISMATCH", "3.7")
    assert parts("RuntimeError: cuDNN error: CUDNN_STATUS_ARCH_MISMATCH")[0][0] == \
        "gpu.too-old-for-cuda-library"
    maxwell = ("RuntimeError: CUDA error: CUBLAS_STATUS_ARCH_MISMATCH when calling `cublasGemmEx("
               " handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, "
               "&fbeta, c, CUDA_R_16F, ldc, CUDA_R_32F, CUBLAS_GEMM_DFALT_TENSOR_OP)`")
    assert not parts(maxwell)
    newer = ("Found GPU0 Quadro M6000 which is of cuda capability 5.2.\n"
             "RuntimeError: CUDA error: CUBLAS_STATUS_ARCH_MISMATCH")
    assert not parts(newer)
    assert parts(newer.replace("5.2", "3.5"))[0][1]["capability"] == "3.5"


def test_the_num_gpus_assert_without_mig_is_the_count_taken_before_the_change():
    """torch's num_gpus assert with its numbers (device=1, num_gpus=1) and no MIG evidence is
    torch counting the GPUs before the script narrowed CUDA_VISIBLE_DEVICES; with nvidia-smi's
    MIG M. column at Enabled beside it, MIG (pytorch/pytorch#131650)."""
    bare = ("RuntimeError: device >= 0 && device < num_gpus INTERNAL ASSERT FAILED at \"/data/a/"
            "pytorch/aten/src/ATen/cuda/CUDAContext.cpp\":50, please report a bug to PyTorch. "
            "device=1, num_gpus=1 compare 1")
    [(mode, got)] = parts(bare)
    assert (mode, got["device"], got["counted"]) == (
        "gpu.visible-devices-changed-after-count", "1", "1")
    mig = row("pytorch/pytorch/issues/131650")["text"]
    assert [m for m, _ in parts(mig)] == ["gpu.mig-one-instance-per-process"]


def test_lightnings_gpu_indices_outside_the_visible_ones():
    """Lightning's own check: the indices asked for and those visible (bene-ges/nemo_compatible
    #16: [1] of [0]); none visible at all ("only has: []", AntixK/PyTorch-VAE#81) is a node or
    build without GPUs, not a remapped index."""
    [(mode, got)] = parts(row("bene-ges/nemo_compatible/issues/16")["text"])
    assert (mode, got["requested"], got["visible"]) == ("gpu.visible-devices-remapped", "[1]",
                                                        "[0]")
    assert not parts("MisconfigurationException: You requested GPUs: [1]\n But your machine "
                     "only has: []")


def test_a_triton_kernel_over_the_gpus_shared_memory_reads_both_sizes():
    """Triton's launch check gives what the kernel's block sizes need and what this GPU has
    (FlashML-org/FreeToken#246: 96 KiB on a 64 KiB GPU); CUDA's own out-of-memory is not it."""
    [(mode, got)] = parts(row("FlashML-org/FreeToken/issues/246")["text"])
    assert (mode, got["kernel needs"], got["gpu has"]) == (
        "gpu.triton-kernel-exceeds-shared-memory", "96 KiB", "64 KiB per block")
    assert "gpu.triton-kernel-exceeds-shared-memory" not in [m for m, _ in parts(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")]


def test_the_drivers_jit_assembler_refusing_newer_ptx_is_the_driver():
    """numba's cuLinkAddData (error 218/222 spelled UNKNOWN_CUDA_ERROR by old numba) with the
    driver's ptxas line: the PTX ISA and the newest one the driver reads are the parts; nvcc's
    own ptxas refusing the same PTX at build time (no driver call) is not the driver."""
    mode, got = parts(row("numba/numba/issues/3794")["text"])[0]
    assert mode == "gpu.ptx-newer-than-driver"
    assert (got["ptx isa"], got["driver reads up to"]) == ("6.3", "6.1")
    build = ("ptxas application ptx input, line 9; fatal   : Unsupported .version 7.8; current "
             "version is '7.4'\nptxas fatal   : Ptx assembly aborted due to errors\n"
             "error: command '/usr/local/cuda/bin/nvcc' failed with exit status 255")
    assert "gpu.ptx-newer-than-driver" not in [m for m, _ in parts(build)]
    assert parts("") == []


def test_no_driver_in_a_container_started_without_the_gpu_is_the_container():
    """torch's "Found no NVIDIA driver" after NVIDIA's image said the driver was not detected,
    or after a docker run line without --gpus: the container was not given the GPU; with
    --gpus on the line (or no container at all) it is not this reading."""
    mode, got = parts(row("jbilcke-hf/FacePoke/issues/12")["text"])[0]
    assert mode == "container.no-gpu-runtime" and "docker run -p 8080:8080" in got["container"]
    given = ("$ docker run --gpus all -it img python x.py\nRuntimeError: Found no NVIDIA driver "
             "on your system. Please check that you have an NVIDIA GPU")
    assert "container.no-gpu-runtime" not in [m for m, _ in parts(given)]
    assert [m for m, _ in parts("RuntimeError: Found no NVIDIA driver on your system.")] == [
        "gpu.no-gpu-on-node"]


@pytest.mark.parametrize("text", [
    "F0504 12:30:02.978602 2662 common.cpp:163] Check failed: error == cudaSuccess (30 vs. 0) "
    "unknown error",  # Caffe's check, CUDA < 10.1's number for unknown
    "cudaGetDeviceCount returned 30\n-> unknown error",  # deviceQuery
    "time=2024-09-05T09:20:35 level=DEBUG msg=x\ncudaSetDevice err: 999",  # ollama's probe
])
def test_cudas_unknown_error_in_other_programs_words_is_the_same_kind(text):
    """The catch-all 'unknown error' as Caffe, deviceQuery and ollama print it is the kind the
    runtime's own text is (a wedged nvidia_uvm, after a suspend or not); 30 means 'unknown'
    only where the text says so (the renumbering of CUDA 10.1)."""
    assert [m for m, _ in parts(text)][:1] == ["gpu.cuda-unknown-error-driver"]
    assert "gpu.cuda-unknown-error-driver" not in [
        m for m, _ in parts("cudaGetDeviceCount returned 3\n-> initialization error")]


@pytest.mark.parametrize("text", [
    "RuntimeError: CUDA error: the launch timed out and was terminated",
    "numba.cuda.cudadrv.driver.CudaAPIError: Call to cuMemFree results in CUDA_ERROR_LAUNCH_TIMEOUT",
    "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=702",
])
def test_a_kernel_the_display_watchdog_ended_is_read_in_each_form(text):
    """cudaErrorLaunchTimeout in the runtime's text, the driver's enum, and its number (702
    since CUDA 10.1; the older 6 changed meaning, so it is left to the text)."""
    assert [r.mode for r in gpu.read(text)] == ["gpu.display-watchdog-timeout"]
    assert gpu.read("THCudaCheck FAIL file=x.cpp line=1 error=6") == []
