"""The op/extension build family parser (doctor/explain/families/build.py) on the real texts of
tests/fixtures/explain_symptoms/build.jsonl: each is read into its parts and the mode its
thread established; texts of other families and empty text give no reading."""

from __future__ import annotations

import pytest

from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import build, programs, python
from tests.harness import symptoms

ROWS = symptoms.rows("build")


def row(url_tail: str) -> dict:
    return next(r for r in ROWS if r["url"].endswith(url_tail))


def parts(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(r.mode, dict(r.parts)) for r in build.read(text)]


# Notices the catalogue's patterns name (tests/test_explain_gpu_logs.py), no parser reads.
NOTICES = {"deepspeed.triton-autotune-df-benign"}


@pytest.mark.parametrize("symptom", [r for r in ROWS if r["mode"] not in NOTICES],
                         ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_each_symptom_reads_as_its_mode(symptom):
    """By the build family, or for a program missing from PATH (nvcc) by the programs one, or
    for a package of the stack another one no longer matches (triton.ops gone under
    bitsandbytes) by the python one."""
    text = symptom["text"]
    readings = build.read(text) or programs.read(text) or python.read(text)
    assert symptom["mode"] in [r.mode for r in readings], [r.mode for r in readings]
    assert all(r.family in ("build", "programs", "python") and r.text for r in readings)


def test_refused_arch_is_too_new_or_retired_by_the_toolkit_release():
    mode, got = parts(row("facebookresearch/3detr/issues/59")["text"])[0]
    assert (mode, got["arch"], got["first cuda that builds it"]) == (
        "toolkit.arch-too-new-for-nvcc", "8.9", "11.8")
    mode, got = parts(row("lbin/DCNv2/issues/25")["text"])[0]  # typographic quotes
    assert (mode, got["arch"]) == ("toolkit.arch-too-new-for-nvcc", "8.6")
    mode, got = parts(row("erikwijmans/Pointnet2_PyTorch/issues/180")["text"])[0]
    assert (mode, got["arch"], got["last cuda that builds it"]) == (
        "toolkit.arch-too-old-for-nvcc", "3.7", "11.8")
    # The nvcc release printed beside the refusal decides: 5.2 under CUDA 13 was retired.
    mode, got = parts("Cuda compilation tools, release 13.0, V13.0.48\n"
                      "nvcc fatal   : Unsupported gpu architecture 'compute_52'")[0]
    assert (mode, got["nvcc"]) == ("toolkit.arch-too-old-for-nvcc", "13.0")
    # No release printed: an arch CUDA 13 dropped (Volta) is the current toolkit retiring it;
    # one newer than 11.8's list (Blackwell) is too new for the toolkit.
    assert parts("nvcc fatal   : Unsupported gpu architecture 'compute_70'")[0][0] == \
        "toolkit.arch-too-old-for-nvcc"
    assert parts("nvcc fatal   : Unsupported gpu architecture 'compute_100'")[0][0] == \
        "toolkit.arch-too-new-for-nvcc"
    # "compute_1." is an older DeepSpeed op builder cutting Blackwell's 12.0 to "1.": no arch
    # nvcc retired or lacks, so neither toolkit mode reads it (nor an arch ".1").
    assert parts("nvcc fatal   : Unsupported gpu architecture 'compute_1.'") == []
    assert parts("-gencode=arch=compute_1.,code=sm_1.\n"
                 "nvcc fatal   : Unsupported gpu architecture 'compute_1.'") == []


def test_cuda_home_forms():
    mode, got = parts(row("IDEA-Research/GroundingDINO/issues/165")["text"])[0]
    assert (mode, got["cuda home"], got["form"]) == (
        "toolkit.cuda-home-malformed", "/usr/local/cuda-11.8:", "a path list")
    mode, got = parts(row("rusty1s/pytorch_cluster/issues/55")["text"])[0]
    assert (mode, got["cuda home"]) == ("toolkit.cuda-home-malformed", "/usr/local/cuda:")
    mode, got = parts(row("LlamaChinese/Llama-Chinese/issues/168")["text"])[0]
    assert (mode, got["cuda home"]) == ("jit.cuda-home-missing", "unset")
    # A single path without nvcc under it is a missing toolkit, not a malformed variable.
    mode, got = parts("No such file or directory: '/usr/local/cuda/bin/nvcc'")[0]
    assert (mode, got["cuda home"]) == ("jit.cuda-home-missing", "/usr/local/cuda")


def test_cuda_versions_of_a_mismatch():
    mode, got = parts(row("bytedance/lightseq/issues/158")["text"])[0]
    assert (mode, got["toolkit"], got["torch"], got["major"]) == (
        "jit.cuda-major-mismatch", "9.0", "10.1", "differs")
    mode, got = parts(row("rusty1s/pytorch_sparse/issues/189")["text"])[0]
    assert (got["toolkit"], got["torch"]) == ("11.2", "10.2")
    # DeepSpeed's own "accepting this combination" is a warning, not the failure.
    assert not parts("Installed CUDA version 10.0 does not match the version torch was "
                     "compiled with 10.2 but since the APIs are compatible, accepting this "
                     "combination")


def test_missing_header_names_the_package_without_its_development_files():
    assert parts(row("GOATmessi8/RFBNet/issues/70")["text"])[0][1]["header"] == "Python.h"
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/2684")["text"])[0]
    assert (mode, got["header"]) == ("toolkit.cuda-headers-missing", "cusolverDn.h")
    mode, got = parts("csrc/aio/py_lib/deepspeed_py_aio.h:12:10: fatal error: libaio.h: No "
                      "such file or directory\nRuntimeError: Error building extension "
                      "'async_io'")[0]
    assert (mode, got["op"]) == ("deepspeed.async-io-no-libaio", "async_io")
    assert not parts("fatal error: myproject/config.h: No such file or directory")
    # The op ninja was building and the object that failed go with the first error.
    mode, got = parts("FAILED: cpu_adam.o\n/x/torch/csrc/python_headers.h:12:10: fatal error: "
                      "Python.h: No such file or directory\nRuntimeError: Error building "
                      "extension 'cpu_adam'")[0]
    assert (mode, got["op"], got["file"]) == ("toolkit.python-headers-missing", "cpu_adam",
                                              "cpu_adam.o")


def test_compiler_killed_missing_or_too_new():
    assert parts(row("cms-sw/cmssw/issues/43117")["text"])[0][1]["killed"] == "cudafe++"
    assert parts(row("NVlabs/nvdiffrast/issues/183")["text"])[0][1]["killed"] == "cc1plus"
    assert parts(row("develer-staff/gccwinbinaries/issues/3")["text"])[0][1]["compiler"] == "gcc"
    # A missing object file is not a missing compiler.
    assert not parts("g++: error: build/temp.linux-x86_64-3.8/box.o: No such file or directory")
    mode, got = parts(row("ggml-org/llama.cpp/issues/9205")["text"])[0]
    assert (mode, got["newest gcc nvcc accepts"]) == ("jit.gcc-too-new-for-nvcc", "13")


def test_deepspeed_ops_and_versions():
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/2066")["text"])[0]
    assert (mode, got["op"]) == ("deepspeed.op-incompatible", "sparse_attn")
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/3211")["text"])[0]
    assert (mode, got["op"]) == ("deepspeed.async-io-no-libaio", "async_io")
    mode, got = parts(row("deepspeedai/Megatron-DeepSpeed/issues/189")["text"])[0]
    assert (mode, got["name"], got["module"]) == ("deepspeed.version-too-old",
                                                  "get_accelerator", "deepspeed")
    # The config error's wording tells the DeepSpeed release: pydantic v1 before 0.15.
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/3827")["text"])[0]
    assert (mode, got["deepspeed"]) == ("deepspeed.version-too-old", "before 0.15")
    mode, got = parts(row("h2oai/h2o-llmstudio/issues/945")["text"])[0]
    assert (mode, got["config"], got["deepspeed"]) == (
        "env.package-version-mismatch", "DeepSpeedBF16Config", "0.15 or later")
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/7635")["text"])[0]
    assert got["api"] == "DeepSpeedEngine.load_checkpoint"


# Real texts, posted at https://github.com/huggingface/transformers-bloom-inference/issues/5
# (Python 3.8 shows a multi-line call's first line only) and at
# https://github.com/OptimalScale/LMFlow/issues/643 (transformers' deepspeed_init, no DeepSpeed
# API); tracebacks as pasted.
INIT_INFERENCE = """Traceback (most recent call last):
  File "bloom-ds-inference.py", line 187, in <module>
    model = deepspeed.init_inference(model,
TypeError: init_inference() got an unexpected keyword argument 'base_dir'"""
DEEPSPEED_INIT = """  File "/LMFlow/src/lmflow/pipeline/utils/raft_trainer.py", line 2021, in _inner_training_loop
    deepspeed_engine, optimizer, lr_scheduler = deepspeed_init(
TypeError: deepspeed_init() got an unexpected keyword argument 'resume_from_checkpoint'"""


def test_a_deepspeed_call_refusing_a_keyword_is_an_older_deepspeed():
    mode, got = parts(INIT_INFERENCE)[0]
    assert (mode, got["api"], got["argument"]) == ("deepspeed.version-too-old",
                                                   "deepspeed.init_inference", "base_dir")
    # The keyword in the call as shown; Python 3.11's markers and a rank prefix between.
    mode, got = parts("[rank0]:     with deepspeed.zero.Init(remote_device='cpu', "
                      "mpu_group=grp):\n[rank0]:          ^^^^^^^^^^^^^^^^^^^^^^^^\n[rank0]: "
                      "TypeError: Init.__init__() got an unexpected keyword argument "
                      "'mpu_group'")[0]
    assert (mode, got["api"], got["argument"]) == ("deepspeed.version-too-old",
                                                   "deepspeed.zero.Init", "mpu_group")
    # Not DeepSpeed's API (a function named deepspeed_init), another callee than the line's
    # call, or no call shown: no reading of this mode.
    for text in (DEEPSPEED_INIT,
                 "    deepspeed.init_distributed(dist_backend='nccl')\n"
                 "TypeError: forward() got an unexpected keyword argument 'labels'",
                 "TypeError: init_inference() got an unexpected keyword argument 'base_dir'"):
        assert "deepspeed.version-too-old" not in [m for m, _ in parts(text)], text


# Real texts: a cuRAND device-API header missing from a build
# (https://github.com/ComputationalRadiationPhysics/haseongpu/issues/20), and names a package
# of the training stack no longer has (https://github.com/THUDM/GLM/issues/86: torch_required
# left transformers after 4.23; https://github.com/kanishkamisra/minicons/issues/94: gone in
# transformers 5).
CURAND_KERNEL = """In file included from include/calc_phi_ase_mpi.hpp:32:0,
                 from src/calc_phi_ase_mpi.cc:25:
include/mesh.hpp:33:48: fatal error: curand_kernel.h: No such file or directory
 #include <curand_kernel.h> /* curand_uniform */"""
TORCH_REQUIRED = ("ImportError: cannot import name 'torch_required' from 'transformers.utils'")
VISION2SEQ = ("ImportError: cannot import name 'AutoModelForVision2Seq' from 'transformers' "
              "(/usr/local/lib/python3.12/dist-packages/transformers/__init__.py)")


def test_any_cuda_toolkit_header_is_the_toolkit_without_headers():
    mode, got = parts(CURAND_KERNEL)[0]
    assert (mode, got["header"]) == ("toolkit.cuda-headers-missing", "curand_kernel.h")
    assert parts("fatal error: cub/cub.cuh: No such file or directory")[0][0] == \
        "toolkit.cuda-headers-missing"
    # NCCL's and cuDNN's headers come with those libraries, not with the toolkit: each has
    # its own mode.
    assert [m for m, _ in parts("fatal error: nccl.h: No such file or directory")] == \
        ["toolkit.nccl-headers-missing"]
    assert [m for m, _ in parts("fatal error: cudnn.h: No such file or directory")] == \
        ["toolkit.cudnn-headers-missing"]


def test_a_name_the_stack_package_lacks_is_a_version_mismatch():
    for text, name, module in ((TORCH_REQUIRED, "torch_required", "transformers.utils"),
                               (VISION2SEQ, "AutoModelForVision2Seq", "transformers")):
        mode, got = parts(text)[0]
        assert (mode, got["name"], got["module"]) == ("env.package-version-mismatch", name,
                                                      module)
    # Python's wording for a circular import (the user's own transformers.py), and a package
    # outside the training stack: no reading.
    assert not parts("ImportError: cannot import name 'AutoTokenizer' from partially "
                     "initialized module 'transformers' (most likely due to a circular import)")
    assert not parts("ImportError: cannot import name 'soft_unicode' from 'markupsafe'")


def test_extensions_folder_readings():
    mode, got = parts(row("huggingface/transformers/pull/18868")["text"])[0]
    assert (mode, got["build tag"], got["op"]) == ("jit.extensions-dir-shared", "py38_cu113",
                                                   "fused_adam")
    mode, got = parts(row("Daikenan/LTMU/issues/10")["text"])[0]
    assert got["path"] == "/tmp/torch_extensions/_prroi_pooling/lock"
    mode, got = parts(row("OpenRLHF/OpenRLHF/issues/208")["text"])[0]
    assert (mode, got["root"]) == ("jit.stale-extension-lock",
                                   ".cache/torch_extensions/py310_cu118")
    # The root announced before the build went on is no lock.
    assert not parts("Using /home/u/.cache/torch_extensions/py311_cu121 as PyTorch extensions "
                     "root...\nLoading extension module fused_adam...")
    mode, got = parts(row("deepspeedai/DeepSpeed/issues/7589")["text"])[0]
    assert (mode, got["arch"]) == ("jit.arch-list-variant", "90a")


def test_other_families_and_empty_text_give_no_reading():
    assert build.read("") == []
    assert build.read("misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                      "10.0.0.2<43211> failed : Software caused connection abort") == []
    assert build.read("ImportError: libcudnn_cnn_infer.so.8: cannot open shared object file: "
                      "No such file or directory") == []
    assert build.read("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB") == []


def test_nvcc_refusing_what_torch_passes_and_triton_without_a_compiler():
    # torch's ninja builds pass --generate-dependencies-with-compile (nvcc 10.2+)
    mode, got = parts(row("levihsu/OOTDiffusion/issues/65")["text"])[0]
    assert (mode, got["option"]) == ("toolkit.nvcc-too-old-for-torch",
                                     "-generate-dependencies-with-compile")
    # Triton's launcher build, in its older and newer wording
    for tail in ("apple/ml-cross-entropy/issues/5", "jamiepine/voicebox/issues/877"):
        assert [(m, got["compiler"]) for m, got in parts(row(tail)["text"])] == [
            ("toolkit.cxx-compiler-missing", "C")]


def test_ptxas_older_than_its_ptx_and_a_python_link_without_the_dev_package():
    mode, got = parts(row("tinygrad/tinygrad/issues/7729")["text"])[0]
    assert (mode, got["ptx isa"], got["newest isa this ptxas knows"]) == (
        "toolkit.ptxas-older-than-ptx", "8.5", "7.5")
    # the driver's own JIT assembler is another cause (a driver older than the toolkit)
    assert parts("ptxas application ptx input, line 9; fatal : Unsupported .version 7.3; "
                 "current version is '7.2'") == []
    mode, got = parts(row("ariovistus/pyd/issues/82")["text"])[0]
    assert (mode, got["library"]) == ("toolkit.python-headers-missing", "python3.5m")



def test_two_cuda_installs_name_both():
    mode, got = parts(row("pytorch/pytorch/issues/106971")["text"])[0]
    assert (mode, got["nvcc headers"], got["toolkit headers"]) == (
        "toolkit.multiple-cuda-installs", "/usr/local/cuda/include", "/usr/local/cuda-12.1/include")
    assert got["nvcc"] == got["toolkit"] == "12.1.66"


def test_ptxas_missing_or_nccl_headers_missing():
    # XLA's wordings across releases and Triton's: no ptxas at all, not one refusing the PTX.
    for url in ("jax-ml/jax/issues/7239", "NixOS/nixpkgs/pull/375186",
                "kijai/ComfyUI-HunyuanVideoWrapper/issues/29"):
        assert "toolkit.ptxas-not-found" in [m for m, _ in parts(row(url)["text"])]
    assert "toolkit.ptxas-not-found" not in [m for m, _ in parts(
        row("tinygrad/tinygrad/issues/7729")["text"])]
    mode, got = parts(row("MegviiRobot/MegBA/issues/15")["text"])[0]
    assert (mode, got["header"]) == ("toolkit.nccl-headers-missing", "nccl.h")


def test_deepspeed_built_where_it_saw_no_gpu():
    """DeepSpeed's setup on a machine without a visible GPU takes the CPU accelerator: its
    oneCCL op fails on the missing oneAPI header, or the op report lists the CPU ops after
    DeepSpeed's warning. The same warning with a CPU-only torch is that torch's; a training
    job's own CPU fallback (no build, no op report) is left to the GPU family."""
    mode, got = parts(row("lamikr/rocm_sdk_builder/issues/8")["text"])[0]
    assert (mode, got["built"]) == ("deepspeed.no-gpu-at-build", "the oneCCL comm op")
    got = dict(parts(row("deepspeedai/DeepSpeed/issues/5553")["text"]))
    assert got["deepspeed.no-gpu-at-build"]["built"] == "the CPU accelerator's ops"
    warning = ("[WARNING] [real_accelerator.py:162:get_accelerator] Setting accelerator to CPU. "
               "If you have GPU or other accelerator, we were unable to detect it.\n")
    report = warning + "DeepSpeed C++/CUDA extension op report\n"
    assert not parts(report + "torch version .................... 2.3.1+cpu")
    assert not parts(warning + "[rank0]: RuntimeError: ProcessGroupNCCL is only supported with GPUs")


def test_extension_built_without_an_arch_to_compile_for():
    mode, got = parts(row("mchong6/JoJoGAN/issues/2")["text"])[0]
    assert (mode, got["cuda home"], got["torch sees"]) == (
        "toolkit.no-gpu-for-arch-list", "/usr/local/cuda", "no CUDA device")
    cpu = ("Using /home/u/.cache/torch_extensions/py37_cpu as PyTorch extensions root...\n"
           "  File \"/env/lib/python3.7/site-packages/torch/utils/cpp_extension.py\", line 1561, "
           "in _get_cuda_arch_flags\n    arch_list[-1] += '+PTX'\nIndexError: list index out of "
           "range")
    mode, got = parts(cpu)[0]
    assert (mode, got["torch build"]) == ("toolkit.no-gpu-for-arch-list", "cpu")
    # the same source line in a traceback that ends elsewhere is not this failure
    assert not parts("    arch_list[-1] += '+PTX'\nKeyError: 'TORCH_CUDA_ARCH_LIST'")


def test_cudnn_header_or_library_not_found_is_cudnn_not_where_the_build_looks():
    mode, got = parts(row("TransformerEngine/issues/918")["text"])[0]
    assert (mode, got["header"]) == ("toolkit.cudnn-headers-missing", "cudnn.h")
    mode, got = parts(row("TransformerEngine/issues/954")["text"])[0]
    assert (mode, got["cmake variable"]) == ("toolkit.cudnn-headers-missing", "cudnn_LIBRARY")
    cmake = "-- Could NOT find CUDNN (missing: CUDNN_LIBRARY_PATH CUDNN_INCLUDE_PATH)"
    assert [m for m, _ in parts(cmake)] == ["toolkit.cudnn-headers-missing"]


@pytest.mark.parametrize("text", [
    # cudnn-frontend is a git submodule of the project: the checkout, not the environment.
    "utils.h:11:10: fatal error: cudnn_frontend.h: No such file or directory",
    # cuDNN found: the build goes on.
    "-- Found CUDNN: /usr/lib/x86_64-linux-gnu/libcudnn.so (found version \"9.1.0\")",
])
def test_cudnn_frontend_or_a_found_cudnn_is_not_it(text):
    assert "toolkit.cudnn-headers-missing" not in [m for m, _ in parts(text)]


def test_an_ops_missing_so_is_its_failed_build_and_an_unlinkable_one_the_shared_cache():
    """No .so at all: the op's build failed earlier (Qwen-VL#188's import after ninja's FAILED);
    a .so whose torch symbols do not resolve: a binary built for another torch in a shared
    cache (jit.extensions-dir-shared); the build tag is optional (HairCLIPv2#10's path)."""
    missing = row("QwenLM/Qwen-VL/issues/188")["text"].splitlines()[-1]
    assert parts(missing)[0] == ("jit.op-build-failed-earlier", {
        "build tag": "py310_cu117", "op": "fused_adam", "error": "cannot open shared object file"})
    untagged = row("wtybest/HairCLIPv2/issues/10")["text"]
    assert parts(untagged)[0][1]["op"] == "fused" and not parts(untagged)[0][1]["build tag"]
    unlinkable = ("ImportError: /root/.cache/torch_extensions/py310_cu118/fused_adam/fused_adam.so"
                  ": undefined symbol: _ZN3c104cuda9SetDeviceEi")
    assert [m for m, _ in parts(unlinkable)] == ["jit.extensions-dir-shared"]
    assert parts("Loading extension module fused_adam...") == []


def test_a_setup_py_joining_a_none_cuda_home_is_the_missing_toolkit():
    # apex's setup.py: [cuda_dir + "/bin/nvcc", "-V"] with torch's CUDA_HOME None (apex#1633)
    text = next(r["text"] for r in ROWS if r["url"].endswith("NVIDIA/apex/pull/1633"))
    message = text.splitlines()[-1]
    around = "\n".join(text.splitlines()[:-1])
    found = [r for r in build.read(message, around) if r.mode == "jit.cuda-home-missing"]
    assert found and dict(found[0].parts)["cuda home"] == "None"
    # the same TypeError from any other join is not a toolkit's absence
    assert not [r for r in build.read(message, '  File "train.py", line 3\n    path = root + "/x"')
                if r.mode == "jit.cuda-home-missing"]


def test_package_checks_of_the_nvcc_say_what_they_compared():
    flash = next(r["text"] for r in ROWS if r["url"].endswith("zai-org/GLM-4/issues/235"))
    assert [dict(r.parts) for r in build.read(flash)
            if r.mode == "toolkit.nvcc-too-old-for-torch"] == [{"flash attn needs cuda": "11.6"}]
    apex = next(r["text"] for r in ROWS if r["url"].endswith("NVIDIA/apex/issues/955"))
    assert [dict(r.parts) for r in build.read(apex)
            if r.mode == "jit.cuda-major-mismatch"] == [{"torch built with cuda": "10.2"}]


def test_a_cxx17_header_the_library_lacks_names_the_gcc_that_first_shipped_it():
    mode, got = parts(row("arthurflor23/text-segmentation/issues/8")["text"])[0]
    assert (mode, got["header"], got["minimum"]) == (
        "toolkit.gcc-too-old-for-torch", "<filesystem> (C++17)", "GCC 8")
    # the paste wrapped after the colon (EQMG/Acid#78: g++ 7.4.0, "upgrade to g++ 8 or above")
    wrapped = ("/home/natty/code/Acid/Sources/StdAfx.hpp:11:10: fatal error: filesystem: \n"
               "No such file or directory")
    assert parts(wrapped)[0][1]["minimum"] == "GCC 8"
    assert parts("x.cpp:3:10: fatal error: optional: No such file or directory")[0][1] == {
        "header": "<optional> (C++17)", "minimum": "GCC 7"}
    # a header of the project or of a library is not the compiler's age
    assert not [m for m, _ in parts("x.cpp:1:10: fatal error: filesystem.hpp: No such file or "
                                    "directory")
                if m == "toolkit.gcc-too-old-for-torch"]
    assert not [m for m, _ in parts("x.cpp:1:10: fatal error: vector: No such file or directory")
                if m == "toolkit.gcc-too-old-for-torch"]


def test_a_cuda_header_newer_toolkits_ship_is_judged_by_the_release_the_log_names():
    # cuda_fp8.h first shipped in CUDA 11.8: a log naming 11.8 reads another root's headers
    # (facebookresearch/xformers#962); one naming 10.2 for cuda_bf16.h (11.0) is too old
    # (deepspeedai/DeepSpeedExamples#669); one naming none lists both (cuda-header-too-new)
    other_root = "  .../third_party/flash-attention/csrc/cutlass/include/cutlass/float8.h:83:10: fatal error: cuda_fp8.h: No such file or directory\n   #include <cuda_fp8.h>\nCuda compilation tools, release 11.8, V11.8.89"
    readings = build.read(other_root)
    assert [(r.mode, dict(r.parts).get("toolkit named")) for r in readings] == [
        ("toolkit.cuda-headers-missing", "CUDA 11.8")]
    _, _, sure, _ = explain_text(other_root)
    assert sure[0].id == "toolkit.cuda-headers-missing"
    too_old = symptoms.text(ROWS, "DeepSpeedExamples/issues/669")
    got = [(r.mode, dict(r.parts)["toolkit"]) for r in build.read(too_old)]
    assert got == [("toolkit.cuda-too-old-for-header", "CUDA 10.2")]
    _, _, sure, _ = explain_text("fatal error: cuda_fp8.h: No such file or directory")
    assert [m.id for m in sure][:2] == ["toolkit.cuda-too-old-for-header",
                                        "toolkit.cuda-headers-missing"]


def test_an_atomic_add_overload_says_which_arch_its_operand_needs():
    """nvcc's missing atomicAdd overload: the operand type (double at open-atmos/PySDM#319,
    __half at ashawkey/torch-ngp#22) names the arch that has it, and the lowest target on the
    nvcc line is read beside it; a build whose every target has the overload gives no reading."""
    [(mode, got)] = [(r.mode, dict(r.parts)) for r in build.read(row("PySDM/issues/319")["text"])]
    assert (mode, got["operand"], got["needs arch"]) == (
        "toolkit.arch-too-old-for-atomic", "double", "6.0")
    half = row("ashawkey/torch-ngp/issues/22")["text"]
    line = "nvcc -gencode=arch=compute_52,code=sm_52 -gencode=arch=compute_61,code=sm_61 -c x.cu\n"
    got = {r.mode: dict(r.parts) for r in build.read(line + half)}
    assert got["toolkit.arch-too-old-for-atomic"]["lowest target"] == "5.2"
    assert "toolkit.arch-too-old-for-atomic" not in {
        r.mode for r in build.read(line.replace("52", "80").replace("61", "90") + half)}


def test_torchs_cmake_asking_for_the_old_nvtx_and_an_nvcc_without_libdevice():
    """torch's CMake files asking for libnvToolsExt name the file that asked
    (pytorch/pytorch#152756: the installed torch's share/cmake); nvcc without nvvm/libdevice names
    the nvcc that ran (CharlesShang/DCNv2#110: /usr/bin/nvcc)."""
    got = {r.mode: dict(r.parts) for r in build.read(row("pytorch/pytorch/issues/152756")["text"])}
    assert got["toolkit.nvtx2-missing-for-torch-cmake"]["cmake file"].endswith(
        "torch/share/cmake/Caffe2/public/cuda.cmake")
    got = {r.mode: dict(r.parts) for r in build.read(row("CharlesShang/DCNv2/issues/110")["text"])}
    assert got["toolkit.nvcc-outside-toolkit"]["nvcc"] == "/usr/bin/nvcc"
    assert not {r.mode for r in build.read("nvcc fatal   : Unknown option '-fopenmp'")} & {
        "toolkit.nvcc-outside-toolkit", "toolkit.nvtx2-missing-for-torch-cmake"}


def test_a_cuda_header_hipcc_asks_for_is_a_source_left_unhipified_not_cuda_headers():
    """hipcc compiling for a gfx target reads no CUDA header once a source is hipified: the CUDA
    header it cannot find is not a CUDA toolkit without headers (no reading); nvcc's is."""
    hip = ("In file included from csrc/multi_tensor_adam.hip:12:\n"
           "torch/include/ATen/cuda/CUDAContext.h:5:10: fatal error: 'cuda_runtime_api.h' file "
           "not found\n1 error generated when compiling for gfx90a.")
    assert "toolkit.cuda-headers-missing" not in [r.mode for r in build.read(hip)]
    nvcc = ("torch/include/ATen/cuda/CUDAContext.h:5:10: fatal error: cuda_runtime_api.h: No such "
            "file or directory")
    assert "toolkit.cuda-headers-missing" in [r.mode for r in build.read(nvcc)]


@pytest.mark.parametrize("name, mode", [
    ("Qwen3Config", "hf.transformers-too-old-for-model"),  # a model's class: an older release
    ("Qwen2_5_VLForConditionalGeneration", "hf.transformers-too-old-for-model"),
    ("TFBertModel", "env.package-missing"),  # TensorFlow's classes need TensorFlow
    ("AutoModelForVision2Seq", "env.package-version-mismatch"),  # every release's name: removed
    ("LLaMAForCausalLM", "env.package-version-mismatch"),  # a pre-release spelling
])
def test_a_name_missing_from_transformers_says_which_release_problem(name, mode):
    text = f"ImportError: cannot import name '{name}' from 'transformers' (/env/lib/python3.10/" \
           "site-packages/transformers/__init__.py)"
    assert [r.mode for r in build.read(text)][:1] == [mode]


def test_transformers_refusing_torch_load_names_the_torch_it_requires(monkeypatch):
    """transformers' own refusal (utils/import_utils.py check_torch_load_is_safe, raised for a
    torch below 2.6 here by patching its version test): the package and the floor it names."""
    from transformers.utils import import_utils

    monkeypatch.setattr(import_utils, "is_torch_greater_or_equal", lambda *a, **k: False)
    with pytest.raises(ValueError) as refused:
        import_utils.check_torch_load_is_safe()
    readings = build.read(f"ValueError: {refused.value}")
    assert [(r.mode, dict(r.parts).get("requires")) for r in readings] == [
        ("env.package-version-mismatch", "torch>=2.6")]
    # the twin: the same words about another floor are read with that floor, and a
    # "require ... to upgrade" sentence about no package of the stack names nothing
    assert dict(build.read("we now require users to upgrade accelerate to at least v1.1.0")[0]
                .parts)["requires"] == "accelerate>=1.1.0"
    assert build.read("we now require users to upgrade the firmware to at least v2.6") == []


def test_torchs_no_gpu_words_inside_an_extension_build_are_the_build_without_an_arch():
    """A Dockerfile RUN of pip or pip's "Building wheel ... (setup.py)" before torch's "Found no
    NVIDIA driver" (torch 1.3-1.7 probed the GPU's arch in the build): the build sees no GPU,
    not the node; the same words without a build step stay the node's."""
    for url in ("rusty1s/pytorch_scatter/pull/79", "facebookresearch/detectron2/issues/56"):
        text = symptoms.text(symptoms.rows("build"), url)
        assert [r.mode for r in build.read(text)] == ["toolkit.no-gpu-for-arch-list"], url
        _, _, sure, _ = explain_text(text)
        assert sure[0].id == "toolkit.no-gpu-for-arch-list", url
    bare = "RuntimeError: Found no NVIDIA driver on your system. Please check that you have a GPU"
    assert build.read(bare) == []
    _, _, sure, _ = explain_text(bare)
    assert sure[0].id == "gpu.no-gpu-on-node"
    # the build step in the lines above the error, the words in the error
    step = dict(build.read("AssertionError: Found no NVIDIA driver on your system.",
                           "Step 7/9 : RUN pip install -e /detectron2_repo")[0].parts)
    assert step["build step"].startswith(": RUN pip install")


def test_cmake_without_a_cuda_compiler_is_cuda_home_but_a_compiler_that_ran_is_not():
    """CMake's "Failed to detect a default CUDA architecture" with an empty compiler output
    ran no nvcc (the toolkit missing); with the compiler's own errors after it, nvcc ran and
    the errors say why (the host gcc's headers): not the missing toolkit."""
    ran_none = "CMake Error at x.cmake:633 (message):\n  Failed to detect a default CUDA architecture.\n\n  Compiler output:\n\nCall Stack (most recent call first):"
    assert [r.mode for r in build.read(ran_none)] == ["jit.cuda-home-missing"]
    ran = ("  Failed to detect a default CUDA architecture.\n\n  Compiler output:\n"
           "/usr/include/c++/14/bits/c++config.h(2668): error: user-defined literal operator not found")
    assert [r.mode for r in build.read(ran)] == ["jit.gcc-too-new-for-nvcc"]
    assert dict(build.read(ran)[0].parts)["gcc"] == "14"


def test_an_arch_name_torchs_findcuda_lacks_is_read_but_a_projects_own_list_form_is_not():
    """9.0a (torch's fallback list without a GPU) and a cut "8" are the environment's arch
    list; the "X.Y(Z.W)" form is a project's own CMake list (its code)."""
    for name in ("9.0a", "8"):
        text = f"Unknown CUDA Architecture Name {name} in CUDA_SELECT_NVCC_ARCH_FLAGS"
        assert [(r.mode, dict(r.parts)["arch"]) for r in build.read(text)] == [
            ("toolkit.arch-unknown-to-torch", name)]
    assert build.read("Unknown CUDA Architecture Name 2.1(2.0) in CUDA_SELECT_NVCC_ARCH_FLAGS") == []


def test_torchs_own_compiler_check_names_the_compiler_and_the_cuda_it_exceeds(tmp_path, monkeypatch):
    """torch.utils.cpp_extension._check_cuda_version, run for real against an nvcc that says
    CUDA 12.4 and a g++ 14.1: torch's own refusal reads as the host compiler too new."""
    import torch
    from torch.utils import cpp_extension

    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(cpp_extension, "_is_binary_build", lambda: True)
    with pytest.raises(RuntimeError) as refused:
        cpp_extension._check_cuda_version("g++", cpp_extension.TorchVersion("14.1.0"))
    readings = build.read(f"RuntimeError: {refused.value}")
    assert [(r.mode, dict(r.parts)["compiler version"], dict(r.parts)["cuda"]) for r in readings] \
        == [("jit.gcc-too-new-for-nvcc", "14.1.0", "12.4")]
    # the twin: a compiler inside the bounds passes torch's check, and its words are absent
    cpp_extension._check_cuda_version("g++", cpp_extension.TorchVersion("12.3.0"))


def test_a_transformers_name_missing_at_import_says_which_way():
    # transformers' own wheels date the name: removed (the importer is older: trl's core.py
    # under transformers 4.40, huggingface/trl#1409) or added (the installed transformers is
    # older: LLaVA's EncoderDecoderCache, haotian-liu/LLaVA#1794)
    _, got = next(p for p in parts(row("huggingface/trl/issues/1409")["text"])
                  if p[0] == "env.package-version-mismatch")
    assert got["transformers"] == "removed in 4.39" and "pin transformers<4.39" in got["direction"]
    _, got = next(p for p in parts(row("haotian-liu/LLaVA/issues/1794")["text"])
                  if p[0] == "env.package-version-mismatch")
    assert got["transformers"] == "added in 4.43" and ">= 4.43" in got["direction"]
    # a name no release table knows keeps the undirected reading
    _, got = next(p for p in parts("ImportError: cannot import name 'LlamaFlashAttention2' "
                                         "from 'transformers.models.llama.modeling_llama'")
                  if p[0] == "env.package-version-mismatch")
    assert "direction" not in got and got["name"] == "LlamaFlashAttention2"


def _parts_of(text: str, mode: str) -> dict[str, str]:
    return symptoms.parts(build, text, mode)


def test_host_compilers_nvcc_refuses_are_told_apart_by_whose_check_it_was():
    """nvcc's range check on clang (its version, Apple's encoding) is the too-new gcc's cause;
    a clang 2.9 (20900) in the same words is too old, and no reading; MSVC refused by nvcc or
    nvcc refused by MSVC's STL is the Visual Studio/CUDA pair, with the CUDA each names."""
    rows = symptoms.rows("build")
    apple = symptoms.text(rows, "apache/mxnet/issues/1212")
    assert _parts_of(apple, "jit.gcc-too-new-for-nvcc")["clang"] == "70002"
    old = "nvcc fatal : The version ('20900') of the host compiler ('clang') is not supported"
    assert "jit.gcc-too-new-for-nvcc" not in [r.mode for r in build.read(old)]
    msvc = symptoms.text(rows, "Jimver/cuda-toolkit/issues/352")
    assert _parts_of(msvc, "toolkit.msvc-cuda-version-mismatch")["cuda"] == "12.1"
    stl = "yvals_core.h(531): fatal error C1189: #error:  STL1002: Unexpected compiler version, " \
          "expected CUDA 10.1 Update 2 or newer"
    assert _parts_of(stl, "toolkit.msvc-cuda-version-mismatch")["needs cuda"] == "10.1 Update 2"
    assert [r.mode for r in build.read(msvc)].count("jit.gcc-too-new-for-nvcc") == 0


def test_glibcs_math_declarations_against_old_cuda_headers_name_the_function():
    text = symptoms.text(symptoms.rows("build"), "xmrig/xmrig-cuda/issues/214")
    assert _parts_of(text, "toolkit.glibc-too-new-for-cuda-headers")["function"] == "sinpi"
    assert not [r for r in build.read("error: exception specification is incompatible with "
                                      "that of previous function \"foo\" (declared at line 3 of "
                                      "src/foo.h)")
                if r.mode == "toolkit.glibc-too-new-for-cuda-headers"]




@pytest.mark.parametrize("words", [
    "src/x.cpp:7:10: fatal error: {h}: No such file or directory",
    "src/x.cpp:7:10: fatal error: '{h}' file not found",
    "x.cu(7): fatal error C1083: Cannot open include file: '{h}': No such file or directory",
])
def test_each_librarys_header_in_each_compilers_words_names_its_package(words):
    """headers.toml's rows read back: every row's example header, in gcc's, clang's and MSVC's
    words, is named toolkit.library-headers-missing by explain (the catalogue's words and the
    table agree) with the row's apt package; a project's own header is no reading."""
    from dsenv.doctor.explain.families import build_compile
    for _, row in build_compile.library_headers():
        text = words.format(h=row["example"])
        _, _, sure, _ = explain_text(text)
        assert sure and sure[0].id == "toolkit.library-headers-missing", (row["example"], sure)
        parts = _parts_of(text, "toolkit.library-headers-missing")
        assert parts["apt"] == row["apt"] and parts["header"] == row["example"]
    own = words.format(h="utils/common.h")
    assert "toolkit.library-headers-missing" not in [r.mode for r in build.read(own)]


def test_a_header_an_existing_mode_owns_is_not_a_librarys():
    for text, mode in (("fatal error: Python.h: No such file or directory",
                        "toolkit.python-headers-missing"),
                       ("fatal error: libaio.h: No such file or directory",
                        "deepspeed.async-io-no-libaio")):
        modes = [r.mode for r in build.read(text)]
        assert mode in modes and "toolkit.library-headers-missing" not in modes


@pytest.mark.parametrize("url_end,mode,part,value", [
    ("apex/issues/1252", "toolkit.nvcc-too-old-for-torch", "option", "threads"),
    ("flash-attention/issues/1750", "toolkit.nvcc-too-old-for-torch", "option", "compress-mode"),
    ("llamafile/issues/56", "toolkit.nvcc-too-old-for-torch", "option", "native"),
    ("colmap/issues/2232", "toolkit.cmake-too-old-for-native-arch", "arch", "compute_native"),
    ("GPUJPEG/issues/104", "toolkit.cmake-too-old-for-native-arch", "arch", "compute_"),
    ("folly/issues/797", "toolkit.gcc-too-old-for-torch", "standard", "gnu++14"),
    ("vcpkg/issues/6556", "toolkit.gcc-too-old-for-torch", "standard", "c++1z"),
    ("AmpTools/issues/133", "toolkit.gcc-headers-break-nvcc", "header", "/usr/include/stdio.h"),
    ("pbrt-v4/issues/87", "toolkit.host-flag-to-nvcc", "flag", "arch=native"),
    ("tiny-cuda-nn/issues/132", "toolkit.source-submodules-missing", "header", "cutlass.h"),
])
def test_what_a_toolchain_refused_is_read_with_its_part(url_end, mode, part, value):
    # an nvcc option newer than this nvcc, CMake < 3.24's "native", GCC 4.x's -std refusal,
    # glibc 2.34's stdio.h under nvcc 11.4, a gcc flag nvcc took as its own, CUTLASS missing
    text = symptoms.text(ROWS, url_end)
    assert symptoms.parts(build, text, mode)[part] == value
    _, _, sure, _ = explain_text(text)
    assert sure and sure[0].id == mode
