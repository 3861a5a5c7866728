"""Building DeepSpeed ops and torch extensions, read by structure: the arch nvcc refused and
the toolkit release that builds it, the CUDA_HOME a missing nvcc was looked up under, the two
CUDA versions of a mismatch, the header a compile could not find, the compiler the OOM killer
ended, the op DeepSpeed could not build, and the versions a DeepSpeed API or config names.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading
from dsenv.doctor.explain.families.build_compile import (
    FAMILY,
    FLAGS,
    compile_readings,
    ext_build_without_gpu,
)
from dsenv.doctor.explain.families.stack_api import transformers_change

# The CUDA release whose nvcc first builds each compute capability, and the last one that
# still does (NVIDIA's release notes; `nvcc --list-gpu-arch` per release). An arch refused by
# an nvcc newer than its last release was retired, by an older one it is too new.
FIRST_CUDA = {"3.5": "5.0", "3.7": "6.5", "5.0": "6.0", "5.2": "6.5", "5.3": "7.0",
              "6.0": "8.0", "6.1": "8.0", "6.2": "8.0", "7.0": "9.0", "7.2": "9.2",
              "7.5": "10.0", "8.0": "11.0", "8.6": "11.1", "8.7": "11.4", "8.9": "11.8",
              "9.0": "11.8", "10.0": "12.8", "10.1": "12.8", "10.3": "12.9", "11.0": "13.0",
              "12.0": "12.8", "12.1": "12.9"}
LAST_CUDA = {"2.0": "8.0", "2.1": "8.0", "3.0": "10.2", "3.2": "10.2", "3.5": "11.8",
             "3.7": "11.8", "5.0": "12.9", "5.2": "12.9", "5.3": "12.9", "6.0": "12.9",
             "6.1": "12.9", "6.2": "12.9", "7.0": "12.9", "7.2": "12.9", "10.1": "12.9"}

# (a two-digit number at least: a "compute_1." is an older DeepSpeed's op builder cutting a
# two-digit major such as 12.0 to "1.", not an arch nvcc dropped or does not know yet)
ARCH = re.compile(r"Unsupported gpu architecture [`'‘\"]?compute_(\d{2,})([a-z]?)(?![\d.])"
                  r"|Value [`'‘]?(?:sm|compute)_(\d+)([a-z]?)['’] is not defined for option", FLAGS)
TRITON_PTXAS = re.compile(r"Internal Triton PTX codegen error|PTXASError|triton/backends/nvidia/bin/"
                          r"ptxas", FLAGS)
NVCC_RELEASE = re.compile(r"release (\d+\.\d+), V\d|/cuda-(\d+\.\d+)\b", FLAGS)
NVCC_PATH = re.compile(r"No such file or directory: '([^'\n]*)/bin/nvcc'"
                       r"|unable to execute '([^'\n]*)/bin/nvcc'"
                       r"|(:/[^\s:'\"]*)/bin/nvcc: not found", FLAGS)
# (DCNv2-style setup.py files print torch's CUDA_HOME before refusing: "CUDA_HOME:None")
CUDA_HOME_UNSET = re.compile(r"CUDA_HOME does not exist|CUDA_HOME environment variable is "
                             r"not set|\bCUDA_HOME\s*[:=]\s*None\b", FLAGS)
# setup.py files' own checks for nvcc: apex's "--cuda_ext was requested, but nvcc was not found"
# (and the packages that copied it), the locate_cuda() helper many CUDA extensions carry, and
# flash-attn's setup.py and its copies (causal-conv1d, mamba-ssm), which skip reading nvcc's
# version when torch found no toolkit, then use the name they never bound
NVCC_NOT_FOUND = re.compile(r"\S+ was requested, but nvcc was not found|The nvcc binary could "
                            r"not be located in your \$PATH|NameError: name 'bare_metal_"
                            r"(?:version|major|minor)' is not defined", FLAGS)
# A setup.py joining torch.utils.cpp_extension.CUDA_HOME with "/bin/nvcc" (apex, Megatron's
# and gpt-neox's fused kernels): CUDA_HOME is None when torch found no toolkit, and the join
# fails. The frame's source line, shown above the TypeError, says what was joined.
NONE_JOIN = re.compile(r"unsupported operand type\(s\) for \+: 'NoneType' and 'str'", FLAGS)
NVCC_JOIN = re.compile(r"(?:cuda_dir|cuda_home|CUDA_HOME)\s*\+\s*[\"']/bin/nvcc[\"']", FLAGS)
# A path join that got None right before hipify's summary line: DeepSpeed's setup.py hipifies
# its ops only under a ROCm torch, where torch.utils.cpp_extension.CUDA_HOME is None, so an op
# builder joining CUDA_HOME (not ROCM_HOME) fails there.
ROCM_CUDA_HOME = re.compile(r"in join\b[\s\S]{0,60}?TypeError: expected str, bytes or "
                            r"os\.PathLike object, not NoneType\s+(Total number of (?:unsupported "
                            r"CUDA function calls|replaced kernel launches))", FLAGS)
CUDA_VERSIONS = re.compile(
    r"Installed CUDA version ([\d.]+) does not match (?:the version torch was compiled "
    r"with|torch version)(?: ([\d.]+))?"
    r"|The detected CUDA version \(([\d.]+)\) mismatches the version that was used to "
    r"compile\s+PyTorch \(([\d.]+)\)", FLAGS)
# nvcc refusing what torch's build passes it: the -std torch needs (c++17 from CUDA 11.0), or the
# --generate-dependencies-with-compile torch's ninja builds pass since 1.8 (nvcc 10.2+).
STD_REFUSED = re.compile(r"Value [`'‘]((?:c|gnu)\+\+\d\d)['’] is not defined for option "
                         r"[`'‘]std|nvcc fatal\s*: Unknown option [`'‘](-*std|-*generate-"
                         r"dependencies-with-compile)['’]", FLAGS)
PACK_HEADER = re.compile(r"/c\+\+/(\d+)/[\w/.]+:\d+:\d+: error: parameter packs not "
                         r"expanded", FLAGS)
NO_OP_HANDLE = re.compile(r"'DeepSpeedCPU(\w+)' object has no attribute '(ds_opt_\w+)'", FLAGS)
GCC_MIN = re.compile(r"current installed version of g\+\+ \(([\d.]+)\) is less than the minimum "
                     r"required version by CUDA ([\d.]+) \(([\d.]+)\)"
                     r"|too old version of GCC\. We need GCC (\d+) or later"
                     r"|unrecognized command[- ]line option [`'‘](-std=c\+\+17)", FLAGS)
# A C++17 standard library header the compiler's libstdc++ does not have yet: the GCC release
# that first shipped it (libstdc++'s C++17 status table,
# https://gcc.gnu.org/onlinedocs/libstdc++/manual/status.html#status.iso.2017).
STD17_HEADERS = {"optional": "7", "variant": "7", "string_view": "7", "any": "7",
                 "filesystem": "8", "charconv": "8", "memory_resource": "9"}
STD17_MISSING = re.compile(r"fatal error: (" + "|".join(STD17_HEADERS) + r"):\s+No such file or "
                           r"directory", FLAGS)
GCC_MAX = re.compile(r"unsupported GNU version! gcc versions later than (\d+)", FLAGS)
# CMake's FindCUDNN finding no cuDNN: cuDNN is not where the build looks.
CUDNN_CMAKE = re.compile(r"Could (?:not|NOT) find (cudnn_LIBRARY|cudnn_INCLUDE_DIR|CUDNN)\b")
DS_OP = re.compile(r"Unable to (?:pre-compile|JIT load the) (\w+)", FLAGS)
# torch 2.2-2.3's wording; 2.0-2.1's ("Python 3.11+ not yet supported for torch.compile"); 2.9's
DYNAMO_PYTHON = re.compile(r"(?:(?:Dynamo|torch\.compile) is not supported on Python |Python "
                           r"(?=3\.\d+\+ not yet supported for torch\. ?compile))(3\.\d+)\+", FLAGS)
NO_TORCH = re.compile(r"Unable to pre-compile ops (?:without torch installed|because torch is not "
                      r"available)", FLAGS)
LIBAIO = re.compile(r"async_io requires the (?:dev libaio|libraries: \['libaio-dev'\])", FLAGS)
CUTLASS = re.compile(r"Please specify (?:the )?CUTLASS (?:location|repo) directory", FLAGS)
VARIANT = re.compile(r"invalid literal for int\(\) with base 10: '(\d+[af])'", FLAGS)
UNKNOWN_ARCH = re.compile(r"Unknown CUDA arch \(([^)\n]*)\) or GPU not supported", FLAGS)
DS_IMPORT = re.compile(r"cannot import name '(\w+)' from '(deepspeed[\w.]*)'", FLAGS)
DS_CONFIG = re.compile(r"validation errors? for (DeepSpeed\w*Config)[\s\S]*?"
                       r"(extra fields not permitted|Extra inputs are not permitted)", FLAGS)
# (also transformers' TrainingArguments and trl's trainers and configs: a training script written
# for another transformers/trl release, in either direction)
KWARG = re.compile(r"((?:DeepSpeed\w*|Accelerator|(?:Seq2Seq)?TrainingArguments|Trainer"
                   r"|(?:SFT|DPO|GRPO|PPO|ORPO|KTO|CPO|Reward)(?:Trainer|Config))\.\w+)\(\) got an "
                   r"unexpected keyword argument '?(\w+)"
                   r"|'((?:Seq2Seq)?TrainingArguments)' object has no attribute '(eval_strategy|"
                   r"evaluation_strategy)'", FLAGS)
# A traceback's source line that calls a DeepSpeed API with a keyword, then the TypeError
# refusing that keyword.
UNKNOWN_KWARG = re.compile(r"TypeError: (?:\w+\.)*(\w+)\(\) got an unexpected keyword argument "
                           r"'(\w+)'")
DS_CALL = re.compile(r"\b(deepspeed(?:\.\w+)+)\(")
# A name the code imports from a package of the training stack that the installed release does
# not have (removed, or not added yet); a circular import is the code's own.
STACK_IMPORT = re.compile(r"cannot import name '(\w+)' from '((?:transformers|accelerate|peft|trl"
                          r"|datasets|torch|tokenizers|safetensors|bitsandbytes|diffusers"
                          r"|optimum|megatron\.core)(?:\.\w+)*)'", FLAGS)
# A class transformers defines per model (Qwen3Config, LlamaForCausalLM): a release older than
# the model; TF*/Flax* ones exist only with TensorFlow/JAX installed (transformers#4137). Not the
# Auto*/PreTrained*/Trainer names every release has (one gone is another release).
MODEL_CLASS = re.compile(r"(?P<fw>TF|Flax)?(?!Auto|LLaMA|PreTrained|Trainer|Training|Generation"
                         r"|Feature|Image)[A-Z]\w*?(?:Config|Model|For[A-Z]\w*|Processor|Tokenizer"
                         r"(?:Fast)?)")
# transformers' dependency_versions_check and require_version: "<req> is required for a
# normal functioning of this module, but found <name>==<version>".
REQUIRED = re.compile(r"(?P<req>[A-Za-z][\w.-]*\s*(?:[<>=!~]=?\s*[\w.*+-]+\s*,?\s*)+) is required "
                      r"for a normal functioning of this module, but found "
                      r"(?P<name>[\w.-]+)==(?P<found>[\w+-]+(?:\.[\w+-]+)*)")
# A feature's check naming the release it needs: "Using the `Trainer` with `PyTorch` requires
# `accelerate>=0.20.1`".
FEATURE = re.compile(r"requires `(?P<req>(?:accelerate|peft|bitsandbytes|torch|transformers|"
                     r"datasets|deepspeed)\s*[<>=!~]=?\s*[\w.]+)`")
# A package refusing a call below the release it requires of another: transformers (>= 4.50)
# refusing torch.load under torch < 2.6 (CVE-2025-32434).
UPGRADE = re.compile(r"require(?:s)? (?:users )?to upgrade (?P<pkg>torch|transformers|accelerate|"
                     r"peft|datasets|deepspeed|huggingface_hub) to at least v?(?P<ver>\d+(?:\.\d+)+)")
CIRCULAR = re.compile(r"partially initialized module|circular import", FLAGS)
# (a module of the stack that moved or went, transformers.deepspeed or torch._six, is read by
# the python family: moved_module)
EXT_SO = re.compile(r"torch_extensions/([^/\s]+)/(\w+)/\2\.so: (undefined symbol)", FLAGS)
# The op's .so is not there at all: its build failed before the import (Qwen-VL#188, sgmse#27).
EXT_NO_SO = re.compile(r"torch_extensions/(?:([^/\s]+)/)?(\w+)/\2\.so: (cannot open shared "
                       r"object file): No such file or directory", FLAGS)
EXT_DENIED = re.compile(r"Permission denied: ?'([^'\n]*torch_extensions[^'\n]*)'", FLAGS)
BATON = re.compile(r"file_baton\.py\"?,? (?:line \d+,? )?in wait|wait \([^)\n]*file_baton\.py",
                   FLAGS)
NO_KERNEL = re.compile(r"no kernel image is available for execution on the device", FLAGS)
DS_OP_USED = re.compile(r"\b(fused_adam|fused_lamb|multi_tensor_adam|transformer_inference"
                        r"|DeepSpeed(?:CPU)?(?:Adam|Lamb)|DS_BUILD_\w+=1)", FLAGS)
NINJA = re.compile(r"Ninja is required to load C\+\+ extensions", FLAGS)
# A ptxas binary run on a PTX file refusing its ISA: the PTX's ISA and the newest this ptxas
# knows. The driver's own JIT says "ptxas application ptx input" (gpu.ptx-newer-than-driver).
PTX_ISA = re.compile(r"ptxas (?!application ptx input)\S+, line \d+; fatal\s*: Unsupported "
                     r"\.version (\d+\.\d+); current version is '(\d+\.\d+)'", FLAGS)
# No ptxas at all where XLA (its wordings across releases) or Triton looks: a runtime-only CUDA.
PTXAS_MISSING = re.compile(r"Can't find ptxas binary in \$\{CUDA_DIR\}/bin|Couldn't invoke ptxas "
                           r"--version|Failed to launch ptxas|Couldn't find a suitable version "
                           r"of ptxas|\bbin/ptxas not found|No PTX compilation provider is "
                           r"available\. Neither ptxas|\bCannot find ptxas(?:\.exe)?\b", FLAGS)
# torch's cuda.cmake: the nvcc CMake chose and the toolkit find_package found differ (two
# toolkits, or one seen through a symlink and its real path).
TWO_CUDA = re.compile(r"Found two conflicting CUDA installs:\s+V([\d.]+) in '([^'\n]*)' and\s+"
                      r"V([\d.]+) in '([^'\n]*)'", FLAGS)
# Linking libpython by its unversioned development name (python3.X-dev ships it).
PY_LINK = re.compile(r"cannot find -l(python\d[\d.]*m?)\b", FLAGS)
ROOT_LAST = re.compile(r"Using\s+(\S+) as PyTorch extensions root\.\.\.\s*\Z")
# Built where no GPU is seen. DeepSpeed's accelerator detection then takes CPU and builds the
# CPU accelerator's ops: its oneCCL comm op (Intel oneAPI headers), or an op report listing
# ccl/shm comm; only in a build or op report (a job's own CPU fallback is the GPU family's).
CCL_OP = re.compile(r"fatal error: oneapi/ccl\.hpp: No such file or directory"
                    r"|building 'deepspeed\.ops\.comm\.deepspeed_ccl_comm_op' extension", FLAGS)
DS_CPU_PICKED = re.compile(r"Setting accelerator to CPU\. If you have GPU or other accelerator, we "
                           r"were unable to detect it", FLAGS)
DS_BUILDING = re.compile(r"DeepSpeed C\+\+/CUDA extension op report|\bDS_BUILD_\w+=1|setup\.py"
                         r"|pip3? install|^deepspeed_(?:ccl|shm)_comm \.", FLAGS)
TORCH_CPU = re.compile(r"Torch not compiled with CUDA enabled|torch version \.+ [\w.]+\+cpu\b"
                       r"|torch cuda version \.+ None", FLAGS)
# torch's extension builder with no TORCH_CUDA_ARCH_LIST and no GPU to take the archs from.
NO_ARCH = re.compile(r"arch_list\[-1\] \+= '\+PTX'(?=[\s\S]{0,600}?IndexError: list index out of "
                     r"range)", FLAGS)
NO_RUNTIME = re.compile(r"No CUDA runtime is found, using CUDA_HOME='([^'\n]*)'", FLAGS)
CPU_ROOT = re.compile(r"torch_extensions/py\d+_cpu\b", FLAGS)

# Messages whose one pattern names the mode; the groups become the parts.
# Packages' own checks of the nvcc they build with: flash-attn's minimum CUDA (nvcc -V, not
# torch's CUDA), apex's comparison of nvcc with torch's CUDA.
FLASH_CUDA_MIN = re.compile(r"FlashAttention is only supported on CUDA ([\d.]+) and above", FLAGS)
APEX_MISMATCH = re.compile(r"Cuda extensions are being compiled with a version of Cuda that does "
                           r"not match the version used to compile Pytorch binaries\.?\s+Pytorch "
                           r"binaries were compiled with Cuda ([\d.]+\d)", FLAGS)

# A source tree built without its git submodules: the build's own hint, or CMake's
# add_subdirectory of an empty third-party folder
# (xformers' setup.py: "CUTLASS submodule not found. Did you forget to run `git submodule ...")
SUBMODULES = re.compile(r"(?:[Tt]ry running|Did you forget to run) [`']?(git submodule update)"
                        r"|does not contain a CMakeLists\.txt file", FLAGS)
SIMPLE = (
    (SUBMODULES, "toolkit.source-submodules-missing", ("hint",)),
    (FLASH_CUDA_MIN, "toolkit.nvcc-too-old-for-torch", ("flash_attn_needs_cuda",)),
    (APEX_MISMATCH, "jit.cuda-major-mismatch", ("torch_built_with_cuda",)),
    (ROCM_CUDA_HOME, "deepspeed.rocm-cuda-home-none", ("hipify_summary",)),
    (GCC_MAX, "jit.gcc-too-new-for-nvcc", ("newest_gcc_nvcc_accepts",)),
    # A CPU optimizer without its op handle: its op's build or load raised before.
    (NO_OP_HANDLE, "deepspeed.cpu-adam-build-failed", ("optimizer", "handle")),
    # nvcc refusing the -std torch passes: an nvcc older than torch's CUDA.
    (STD_REFUSED, "toolkit.nvcc-too-old-for-torch", ("standard", "option")),
    # The libstdc++ header (/usr/include/c++/<gcc major>/...) nvcc's front end cannot parse.
    (PACK_HEADER, "toolkit.gcc-headers-break-nvcc", ("gcc",)),
    # A name the code imports from deepspeed that this release does not have yet.
    (DS_IMPORT, "deepspeed.version-too-old", ("name", "module")),
    # An op's binary in the shared cache that this environment's torch cannot link.
    (EXT_SO, "jit.extensions-dir-shared", ("build_tag", "op", "error")),
    (EXT_NO_SO, "jit.op-build-failed-earlier", ("build_tag", "op", "error")),
    (EXT_DENIED, "jit.extensions-dir-not-writable", ("path",)),
    (NINJA, "jit.ninja-missing", ()),
    # DS_BUILD_OPS with no torch in the build: before (and instead of) any op failure.
    (NO_TORCH, "deepspeed.precompile-without-torch", ()),
    # torch.compile on a Python newer than this torch's Dynamo handles.
    (DYNAMO_PYTHON, "env.python-too-new-for-dynamo", ("python",)),
    (VARIANT, "jit.arch-list-variant", ("arch",)),
    (UNKNOWN_ARCH, "toolkit.arch-unknown-to-torch", ("arch",)),
    (PTX_ISA, "toolkit.ptxas-older-than-ptx", ("ptx_isa", "newest_isa_this_ptxas_knows")),
    (PTXAS_MISSING, "toolkit.ptxas-not-found", ()),
    (PY_LINK, "toolkit.python-headers-missing", ("library",)),
    (CUDNN_CMAKE, "toolkit.cudnn-headers-missing", ("cmake_variable",)),
    (TWO_CUDA, "toolkit.multiple-cuda-installs", ("nvcc", "nvcc_headers", "toolkit",
                                                  "toolkit_headers")),
)

def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def _arch(digits: str) -> str:
    return f"{digits[:-1]}.{digits[-1]}"  # compute_89 -> 8.9, compute_120 -> 12.0


def _arch_reading(message: str) -> Reading | None:
    found = ARCH.search(message)
    if not found:
        return None
    arch = _arch(found.group(1) or found.group(3))
    release = NVCC_RELEASE.search(message)
    nvcc = (release.group(1) or release.group(2)) if release else ""
    first, last = FIRST_CUDA.get(arch, ""), LAST_CUDA.get(arch, "")
    if nvcc and last and _version(nvcc) > _version(last):
        retired = True  # the loaded nvcc is newer than the last release that built it
    elif nvcc and first:
        retired = False  # the loaded nvcc predates the arch (or the row says nothing else)
    else:
        # No nvcc version in the message: archs below 5.0 are gone from every CUDA 12
        # toolkit, and those CUDA 13 dropped (the last release 12.9) are refused by the
        # current one; anything else nvcc refuses is newer than the toolkit.
        retired = _version(arch) < (5, 0) or last == "12.9"
    mode = "toolkit.arch-too-old-for-nvcc" if retired else "toolkit.arch-too-new-for-nvcc"
    if not retired and TRITON_PTXAS.search(message):
        # Triton's own ptxas refusing a GPU newer than it: not the toolkit's nvcc
        return reading(FAMILY, "toolkit.triton-ptxas-too-old", found.group(0), arch=arch,
                       ptxas="triton's bundled ptxas")
    return reading(FAMILY, mode, found.group(0), arch=arch, nvcc=nvcc,
                   first_cuda_that_builds_it=first, last_cuda_that_builds_it=last)


def _cuda_home_reading(message: str, around: str = "") -> Reading | None:
    joined = NONE_JOIN.search(message)
    if joined and NVCC_JOIN.search(f"{message}\n{around}"):
        return reading(FAMILY, "jit.cuda-home-missing", joined.group(0), cuda_home="None",
                       form="torch found no CUDA toolkit, and a setup.py joined its CUDA_HOME")
    found = NVCC_PATH.search(message)
    if found:
        home = next(g for g in found.groups() if g is not None)
        # A ':' means CUDA_HOME was exported like PATH (a list or a trailing ':'); a home
        # ending in /bin means bin/ was doubled. Otherwise it points where no nvcc is.
        if ":" in home or home.endswith("/bin"):
            return reading(FAMILY, "toolkit.cuda-home-malformed", found.group(0),
                           cuda_home=home, form="a path list" if ":" in home else "…/bin")
        return reading(FAMILY, "jit.cuda-home-missing", found.group(0), cuda_home=home,
                       form="no bin/nvcc there")
    unset = CUDA_HOME_UNSET.search(message) or NVCC_NOT_FOUND.search(message)
    if unset:
        return reading(FAMILY, "jit.cuda-home-missing", unset.group(0), cuda_home="unset",
                       form="no toolkit found")
    return None


def _gcc_min_reading(message: str) -> Reading | None:
    """The g++ torch's extension builder (or its headers, or the compiler's own -std
    refusal) found too old: its version, torch's CUDA and the minimum, where printed; or a
    C++17 library header the compiler's libstdc++ lacks, and the GCC that first shipped it."""
    found = GCC_MIN.search(message)
    if not found:
        header = STD17_MISSING.search(message)
        return header and reading(FAMILY, "toolkit.gcc-too-old-for-torch", header.group(0),
                                  header=f"<{header.group(1)}> (C++17)",
                                  minimum=f"GCC {STD17_HEADERS[header.group(1)]}")
    gcc, cuda, minimum, needed, flag = found.groups()
    return reading(FAMILY, "toolkit.gcc-too-old-for-torch", found.group(0), gcc=gcc or "",
                   cuda=cuda or "", minimum=minimum or (f"{needed}" if needed else "")
                   or ("C++17" if flag else ""))


def _deepspeed_readings(message: str) -> list[Reading]:
    found = []
    op = DS_OP.search(message)
    libaio = LIBAIO.search(message)
    if libaio or (op and op.group(1) == "async_io"):
        # async_io's only requirement is libaio (headers and library).
        found.append(reading(FAMILY, "deepspeed.async-io-no-libaio",
                             (libaio or op).group(0), op="async_io"))
    elif op or CUTLASS.search(message):
        hit = op or CUTLASS.search(message)
        found.append(reading(FAMILY, "deepspeed.op-incompatible", hit.group(0),
                             op=op.group(1) if op else "evoformer_attn"))
    kernel, ds_op = NO_KERNEL.search(message), DS_OP_USED.search(message)
    if kernel and ds_op:
        # Only with a DeepSpeed op (or a DS_BUILD_* precompile) beside it: a bare "no kernel
        # image" is as often torch's own build (gpu.toml).
        found.append(reading(FAMILY, "deepspeed.op-missing-arch", kernel.group(0),
                             op=ds_op.group(1)))
    config = DS_CONFIG.search(message)
    if config:
        # pydantic v1 wording: DeepSpeed before 0.15 refusing newer keys; the v2 wording:
        # DeepSpeed 0.15+ refusing keys an older caller (transformers) still passes.
        old = config.group(2).lower().startswith("extra fields")
        found.append(reading(FAMILY, "deepspeed.version-too-old" if old
                             else "env.package-version-mismatch", config.group(0)[:80],
                             config=config.group(1),
                             deepspeed="before 0.15" if old else "0.15 or later"))
    called = _deepspeed_call_refused(message)
    if called:  # the training code calls DeepSpeed's API as a newer release has it
        found.append(reading(FAMILY, "deepspeed.version-too-old", called[2], api=called[0],
                             argument=called[1]))
    name = STACK_IMPORT.search(message)
    if name and not CIRCULAR.search(message):
        model = MODEL_CLASS.fullmatch(name.group(1)) if name.group(2) == "transformers" else None
        found.append(reading(FAMILY, "env.package-version-mismatch" if not model else
                             "env.package-missing" if model["fw"] else
                             "hf.transformers-too-old-for-model", name.group(0),
                             name=name.group(1), module=name.group(2),
                             **transformers_change(name.group(2), name.group(1))))
    if upgrade := UPGRADE.search(message):
        found.append(reading(FAMILY, "env.package-version-mismatch", upgrade.group(0),
                             requires=f"{upgrade['pkg']}>={upgrade['ver']}"))
    need = REQUIRED.search(message) or FEATURE.search(message)
    if need:  # the release one package requires of another, and the one it found
        found.append(reading(FAMILY, "env.package-version-mismatch", need.group(0),
                             requires=need["req"].strip(),
                             found=f"{need['name']} {need['found']}" if need.re is REQUIRED
                             else ""))
    kwarg = KWARG.search(message)
    if kwarg:  # one package calls another's API as another release has it
        found.append(reading(FAMILY, "env.package-version-mismatch", kwarg.group(0),
                             api=kwarg.group(1) or kwarg.group(3),
                             argument=kwarg.group(2) or kwarg.group(4)))
    return found


def _deepspeed_call_refused(message: str) -> tuple[str, str, str] | None:
    """(API, keyword, TypeError) when the source line a traceback shows just before the
    TypeError calls ``deepspeed.<api>(`` with the keyword the TypeError refuses: the code
    passes an argument the installed DeepSpeed does not have yet."""
    for refused in UNKNOWN_KWARG.finditer(message):
        before = message[max(0, refused.start() - 400):refused.start()]
        calls = list(DS_CALL.finditer(before))
        if not calls:
            continue
        api, function, keyword = calls[-1][1], refused[1], refused[2]
        # The keyword is in the call as shown, or the TypeError names the function the line
        # calls (Python before 3.11 shows only a multi-line call's first line).
        if re.search(rf"\b{keyword}\s*=", before[calls[-1].start():]) \
                or api.rsplit(".", 1)[-1] == function:
            return api, keyword, refused[0]
    return None


def _jit_readings(message: str) -> list[Reading]:
    found = []
    # Waiting in FileBaton, or a log whose last line is the JIT announcing its root: the
    # build lock is held and nothing follows.
    baton = BATON.search(message) or ROOT_LAST.search(message)
    if baton:
        found.append(reading(FAMILY, "jit.stale-extension-lock", baton.group(0).strip(),
                             root=baton.group(1) if baton.re is ROOT_LAST else ""))
    versions = CUDA_VERSIONS.search(message)
    if versions and "accepting this combination" not in message:
        toolkit = versions.group(1) or versions.group(3)
        torch = versions.group(2) or versions.group(4) or ""
        found.append(reading(FAMILY, "jit.cuda-major-mismatch", versions.group(0),
                             toolkit=toolkit, torch=torch,
                             major="differs" if torch and _version(toolkit)[0]
                             != _version(torch)[0] else "same" if torch else ""))
    return found


def _no_gpu_readings(message: str, around: str = "") -> list[Reading]:
    """A build where torch saw no GPU: DeepSpeed building its CPU accelerator's ops, or
    torch's extension builder left without an arch to compile for (the build step may be in
    the lines above the error)."""
    found = []
    ccl = CCL_OP.search(message)
    picked = DS_CPU_PICKED.search(message)
    if ccl or (picked and DS_BUILDING.search(message) and not TORCH_CPU.search(message)):
        found.append(reading(FAMILY, "deepspeed.no-gpu-at-build", (ccl or picked).group(0),
                             accelerator="cpu (auto-detected)",
                             built="the oneCCL comm op" if ccl else "the CPU accelerator's ops"))
    arch = NO_ARCH.search(message)
    if arch:
        runtime = NO_RUNTIME.search(message)
        found.append(reading(FAMILY, "toolkit.no-gpu-for-arch-list", arch.group(0),
                             torch_sees="no CUDA device" if runtime or not CPU_ROOT.search(message)
                             else "no CUDA (a CPU-only torch)",
                             cuda_home=runtime.group(1) if runtime else "",
                             torch_build="cpu" if CPU_ROOT.search(message) else ""))
    elif built := ext_build_without_gpu(message, around):
        found.append(reading(FAMILY, "toolkit.no-gpu-for-arch-list", built[0],
                             build_step=built[1]))
    return found


# DeepSpeed's batch check with world_size 1 where the job has more GPUs, beside DeepSpeed 0.9.0
# or accelerate 0.17/0.18: the pairing that counted one process (DeepSpeed#3228; the fix is
# deepspeed 0.8.3 or a newer accelerate), not a wrong GPU count.
BATCH_WORLD_1 = re.compile(r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step "
                           r"\* world_size \d+ != \d+ \* \d+ \* 1\b")
PAIRING = re.compile(r"\bdeepspeed\W{0,3}(?:v|==|:\s*|\s+)(?P<ds>0\.9\.0)\b|\baccelerat\w*\W{0,3}"
                     r"(?:v|==|:\s*|\s+)(?P<acc>0\.1[78]\.\d)", re.IGNORECASE)


def _batch_pairing_reading(message: str, around: str) -> Reading | None:
    batch, pair = BATCH_WORLD_1.search(message), PAIRING.search(f"{message}\n{around}")
    if not (batch and pair):
        return None
    return reading(FAMILY, "env.package-version-mismatch", batch.group(0), world_size="1",
                   deepspeed=pair["ds"] or "", accelerate=pair["acc"] or "")


def read(message: str, around: str = "") -> list[Reading]:
    if not message:
        return []
    found = [r for r in (_arch_reading(message), _cuda_home_reading(message, around),
                         _gcc_min_reading(message), _batch_pairing_reading(message, around)) if r]
    for pattern, mode, names in SIMPLE:
        hit = pattern.search(message)
        if hit:
            parts = {n: g or "" for n, g in zip(names, hit.groups(), strict=True)}
            found.append(reading(FAMILY, mode, hit.group(0), **parts))
    return found + compile_readings(message) + _deepspeed_readings(message) + \
        _jit_readings(message) + _no_gpu_readings(message, around)
