"""What a failed compile says: the header it could not find (and the package that lacks its
development files), a compiler the OOM killer stopped, a compiler that is not there or refuses
an x86-only flag, DeepSpeed's Linux-only link probes on Windows, the toolchain CMake/nvcc
looked for, torch finding no GPU inside an extension build; with the op being built and the
object that failed. Part of the build family (build.py; the gpu family asks the last too)."""

from __future__ import annotations

import re
from functools import cache

from dsenv.data import load_table
from dsenv.doctor.explain.families import Reading, reading
from dsenv.doctor.explain.families.cuda_errors import KINDS, NO_DRIVER

FAMILY = "build"  # build.py's family: its readings are the build family's
FLAGS = re.IGNORECASE | re.MULTILINE

# A header a compiler could not open, with or without an extension (Eigen/Core), in gcc's
# words whatever the language after them, clang's ("fatal error: 'crypt.h' file not found"),
# MSVC's and uv's hint. The first one names the package: the toolkit's, Python's, or through
# ../headers.toml a third-party library's (a header no row matches is the project's own)
ANY_HEADER = re.compile(r"fatal error\s*[:：]\s*[<'\"‘]?([\w.+-]+(?:/[\w.+-]+)*)[>'\"’]?"
                        r"(?:\s*[:：]|\s*$| file not found)"
                        r"|C1083: Cannot open include file: ['\"]([^'\"\n]+)['\"]"
                        r"|install a library that provides \"([^\"\n]+)\" for", FLAGS)
# CUDA headers of types newer toolkits added (cuda_bf16.h in 11.0, cuda_fp8.h in 11.8, cuda_fp4.h and
# cuda_fp6.h in 12.8: NVIDIA's CUDA Math API release notes), and the toolkit release a log names
CUDA_HEADER_SINCE = {"cuda_bf16.h": (11, 0), "cuda_fp8.h": (11, 8), "cuda_fp4.h": (12, 8),
                     "cuda_fp6.h": (12, 8)}
CUDA_RELEASE_SEEN = re.compile(r"/cuda-(\d+)\.(\d+)\b|Cuda compilation tools, release (\d+)\.(\d+)"
                               r"|detected CUDA version \((\d+)\.(\d+)|\bcuda version (?:is )?(\d+)\.(\d+)",
                               FLAGS)
# cuDNN's own headers (not cudnn_frontend.h: a git submodule of the project being built).
CUDNN_HEADER = re.compile(r"cudnn(?:_version|_backend)?\.h$")
EXTENSION = re.compile(r"Error building extension '(\w+)'", FLAGS)
FAILED_OBJECT = re.compile(r"^FAILED: (\S+)", FLAGS)
KILLED = re.compile(r"Killed signal terminated program ([\w+]+)|'([\w+]+)' died due to "
                    r"signal 9|internal compiler error: Killed \(program ([\w+]+)\)", FLAGS)
NO_COMPILER = re.compile(
    r"error: command '(?:[\w./+-]*/)?((?:[\w-]*-)?(?:g\+\+|gcc|c\+\+|cc))' failed: No such file"
    r"|^(?:make: )?(g\+\+|gcc|c\+\+|cc): No such file or directory"
    # gcc without its C++ front end, in gcc 4's, older and current words (not a cc1plus that
    # exists but may not be run: "execvp: Permission denied")
    r"|(?:error trying to exec|installation problem, cannot exec|cannot execute) [‘'\"`](cc1plus)"
    r"[’'\"](?!: execvp: Permission denied)|Command '\['which', '(c\+\+)'\]' returned non-zero"
    # Triton's launcher build (triton/runtime/build.py) finding no $CC, cc, gcc or clang.
    r"|Failed to find (C) compiler\. Please specify via CC environment variable"
    # gcc's collect2 without the linker it runs (binutils' ld off PATH, or the gold/mold a
    # -fuse-ld flag names): ublue-os/bluefin#2349, ldc-developers/ldc#3117
    r"|fatal error: cannot find [‘'\"`](ld)[’'\"]"
    # torch.compile's Inductor probing the compilers of torch._inductor.config.cpp.cxx
    r"|InvalidCxxCompiler: No working (C\+\+) compiler found", FLAGS)

# -march=native is an x86 option: gcc for POWER (and Arm) wants -mcpu=native, and Apple's
# clang for arm64 refuses it outright (a cross compiler's "unknown value 'native'" is not this)
MARCH_NATIVE = re.compile(r"(?:(?:^|\s)(gcc|g\+\+|c\+\+|cc1(?:plus)?|cc|clang(?:\+\+)?): )?error: "
                          r"(?:unrecognized command[- ]line option|the clang compiler does not "
                          r"support) [‘'`\"](-march=native)[’'\"]", FLAGS)
# MSVC's link of DeepSpeed's async_io / GDS probes: -laio and -lcufile become aio.lib and
# cufile.lib, which no Windows system has (link.exe words it in the system's language)
WINDOWS_PROBE = re.compile(r"LNK1181\b[^\n]*?\b((?:aio|cufile)\.lib)", FLAGS)

# The CUDA toolkit's own headers: the runtime and its math libraries (cuda*, cu<lib>*: cuBLAS,
# cuRAND and its device API curand_kernel.h, cuSPARSE, cuSOLVER, cuFFT), NVTX, NVRTC, and the
# CUB/Thrust folders it ships. NCCL's nccl.h and cuDNN's cudnn.h come with those libraries
# (toolkit.nccl-headers-missing, toolkit.cudnn-headers-missing).
CUDA_HEADER = re.compile(r"^(?:(?:cub|thrust|cuda)/.+|cuda\w*\.h|cu(?:blas|rand|sparse|solver|fft)"
                         r"\w*\.h|nvToolsExt\.h|nvtx3/.+|nvrtc\.h)$")

# torch's CMake files (share/cmake/Caffe2/public/cuda.cmake) ask for the old NVTX library that
# CUDA 12 on Windows, conda's CUDA layout and CUDA >= 12.9 no longer ship (header-only nvtx3)
NVTX = re.compile(r"Failed to find nvToolsExt|target \"torch::nvtoolsext\" contains"
                  r"|cannot find -lLIBNVTOOLSEXT-NOTFOUND", FLAGS)
CMAKE_FILE = re.compile(r"CMake Error at (\S+\.cmake):\d+", FLAGS)
# An atomicAdd overload the target arch lacks: the operand type says which arch has it (CUDA C
# Programming Guide, atomicAdd: double from 6.x, __half2 from 6.x, __half from 7.x, bf16 8.x)
ATOMIC = re.compile(r"no instance of overloaded function \"atomicAdd\" matches the argument list"
                    r"(?:,?\s*argument types are: \((?:const )?(?P<type>[\w:]+) \*)?", FLAGS)
ATOMIC_FLOOR = {"double": "6.0", "__half2": "6.0", "half2": "6.0", "__half": "7.0", "half": "7.0",
                "c10::Half": "7.0", "__nv_bfloat16": "8.0", "__nv_bfloat162": "8.0",
                "c10::BFloat16": "8.0"}
TARGETS = re.compile(r"(?:arch=compute_|-arch=sm_|--gpu-architecture=compute_)(\d+)", FLAGS)
HIP_COMPILE = re.compile(r"when compiling for gfx\d|\bhipcc\b|\.hip:\d+", FLAGS)
# nvcc without the toolkit around it (a distro /usr/bin/nvcc, a symlink): no nvvm/libdevice
LIBDEVICE = re.compile(r"(?:nvcc fatal\s*:\s*)?[Pp]ath to libdevice (?:library )?not specified"
                       r"(?:[^\n]*\n[^\n]*?command '(?P<nvcc>[^']*nvcc)' failed)?", FLAGS)


def _toolkit_readings(message: str, where: dict) -> list[Reading]:
    found = []
    if nvtx := NVTX.search(message):
        cmake = CMAKE_FILE.search(message)
        found.append(reading(FAMILY, "toolkit.nvtx2-missing-for-torch-cmake", nvtx.group(0),
                             cmake_file=cmake.group(1) if cmake else "", **where))
    atomic = ATOMIC.search(message)
    built = sorted({int(t) for t in TARGETS.findall(message)})
    floor = ATOMIC_FLOOR.get(atomic["type"] or "", "") if atomic else ""
    # every target at or above the operand's floor: the overload is missing for another reason
    if atomic and not (built and floor and built[0] >= int(floor.replace(".", ""))):
        found.append(reading(FAMILY, "toolkit.arch-too-old-for-atomic", atomic.group(0)[:90],
                             operand=atomic["type"] or "not printed",
                             needs_arch=floor,
                             lowest_target=f"{built[0] // 10}.{built[0] % 10}" if built else "",
                             **where))
    if libdevice := LIBDEVICE.search(message):
        found.append(reading(FAMILY, "toolkit.nvcc-outside-toolkit", libdevice.group(0)
                             .split("\n")[0], nvcc=libdevice["nvcc"] or "", **where))
    return found


# The toolchain the build looked for, in CMake's, nvcc's and setuptools' words: (words, mode,
# names of what the words' groups carry).
TOOLCHAIN = (
    # CMake found no nvcc (CUDA_HOME/PATH/CUDACXX), or ran none: no compiler output at all
    (re.compile(r"No CMAKE_CUDA_COMPILER could be found|CMAKE_CUDA_COMPILER:\s+\S*nvcc(?:\.exe)?\s+"
                r"is not a full path and was not found in the PATH|Could not find compiler set in "
                r"environment variable CUDACXX|Failed to detect a default CUDA architecture\.\s*"
                r"(?:Compiler output:\s*)?(?:Call Stack|\Z)", FLAGS), "jit.cuda-home-missing", ()),
    # a setup.py that drives CMake (its CMakeBuild, dlib's own check) finding no cmake on PATH
    (re.compile(r"CMake must be installed to build the following extensions: ?(\S*)"
                r"|(CMake) is not installed on your system!", FLAGS), "toolkit.cmake-missing",
     ("extension", "extension")),
    # Visual Studio generators compile CUDA through the toolkit's MSBuild integration
    (re.compile(r"No CUDA toolset found", FLAGS), "toolkit.cuda-vs-integration-missing", ()),
    (re.compile(r"nvcc fatal\s*:\s*Cannot find compiler [`'\u2018]?(cl\.exe)['\u2019]? in PATH"
                r"|error: command '(?:[^'\n]*[\\/])?(cl(?:\.exe)?)' failed: No such file or "
                r"directory"
                # setuptools' words for no MSVC at all (its _augment_exception), older and newer
                r"|(Microsoft Visual C\+\+) 1\d\.\d (?:or greater )?is required", FLAGS),
     "toolkit.cxx-compiler-missing", ("compiler", "compiler", "compiler")),
    # torch's FindCUDA (select_compute_arch.cmake) on an arch name it has no table entry for
    # (9.0a from torch's own fallback list, a cut "8"); the "X.Y(Z.W)" form comes from a
    # project's own arch list (old lua-torch scripts, k2), its code, not the environment
    (re.compile(r"Unknown CUDA Architecture Name (\d+(?:\.\d+)?a?) in CUDA_SELECT_NVCC_ARCH_FLAGS",
                FLAGS),
     "toolkit.arch-unknown-to-torch", ("arch",)),
    # torch's own compiler check before a CUDA extension build (cpp_extension._check_cuda_version)
    (re.compile(r"The current installed version of ([\w+]+) \(([\d.]+)\) is greater than the "
                r"maximum required version by CUDA (\d+(?:\.\d+)*)", FLAGS), "jit.gcc-too-new-for-nvcc",
     ("compiler", "compiler_version", "cuda")),
    # An extension's source written against torch APIs later removed: the TH/THC headers (gone
    # in torch 1.11) and their macros, AT_CHECK (gone in 1.5)
    (re.compile(r"(?:fatal error: |^)[`'\"‘]?(THC?/TH[A-Za-z]*\.(?:h|cuh))[`'\"’]?(?:: | file not "
                r"found)|[`'\"‘](AT_CHECK|THCudaCheck|THCState|THCudaMalloc|THCudaFree|THCCeilDiv|"
                r"THCNumberBlocks|THCState_getCurrentStream)[`'\"’] (?:was not declared in this "
                r"scope|is undefined)|identifier \"(AT_CHECK|THC\w+)\" is undefined", FLAGS),
     "toolkit.ext-source-older-than-torch", ("removed", "removed", "removed")),
    # torch's own headers refusing the standard the project's flags pin (-std=c++14 and the like)
    (re.compile(r"You need C\+\+(1[47]) to compile PyTorch|C\+\+(1[47]) or later compatible "
                r"compiler is required to use PyTorch", FLAGS),
     "toolkit.ext-forces-old-cxx-std", ("standard", "standard")),
    # MSVC without the Windows SDK: the C runtime's and Windows' own headers, the resource compiler
    (re.compile(r"C1083[:\s][^\n]*?[\"'“‘`]((?:io|stddef|stdio|stdlib|string|crtdbg|corecrt|ctype|"
                r"float|math|wchar|time|errno|assert|malloc|windows|basetsd|winsock2|winapifamily|"
                r"sdkddkver|windef)\.h)[\"'”’`]|LNK1158: cannot run [`'\"‘]?(rc\.exe)", FLAGS),
     "toolkit.windows-sdk-missing", ("missing", "missing")),
    # Apple's clang (or any clang without libomp) asked for OpenMP
    (re.compile(r"clang(?:\+\+)?: error: unsupported option [`'\"‘](-fopenmp)|fatal error: [`'\"‘]"
                r"(omp\.h)[`'\"’] file not found|ld: library (?:not found for -l(g?omp|iomp5)\b|"
                r"[`'\"‘](g?omp|iomp5)[`'\"’] not found)", FLAGS),
     "toolkit.clang-without-openmp", ("needs", "needs", "needs", "needs")),
    # a host compiler's flag handed to nvcc without -Xcompiler (the build files' CFLAGS, a
    # CMake target's options for every language): nvcc quotes it, with or without its dash
    (re.compile(r"nvcc fatal\s*:\s*[Uu]nknown option [`'‘](-{0,2}(?:f(?!mad\b|tz\b|template-|"
                r"device-|orward-|atbin\b)[a-z][\w+=.-]*|W(?:all|extra|pedantic|missing-(?:"
                r"declarations|noreturn|prototypes)|shadow[\w=-]*|format[\w=-]*|sign-[\w-]+|"
                r"unused[\w-]*|conversion|cast-qual|pointer-arith)|m(?:arch|tune|cpu|fpu|avx\w*|"
                r"sse\w*|fma|f16c)\b[\w=.+-]*|pthread|openmp[\w:]*|Qunused-arguments))['’]", FLAGS),
     "toolkit.host-flag-to-nvcc", ("flag",)),
    # a gcc -march/-mf16c value reaching nvcc unwrapped: nvcc reads "-march=native" as its own
    # -arch and refuses the value
    (re.compile(r"nvcc fatal\s*:\s*[`'‘]((?:arch|tune|cpu)=[\w.+-]+|f16c|fma|avx\w*|sse[\w.]*|"
                r"bmi2?|popcnt|lzcnt)['’]:\s*expected a number", FLAGS),
     "toolkit.host-flag-to-nvcc", ("flag",)),
    # options a newer nvcc has: --threads (11.2), -compress-mode (12.8), -arch=native (11.6)
    (re.compile(r"nvcc fatal\s*:\s*Unknown option [`'‘]-{0,2}(threads|compress-mode)(?:=\w+)?['’]"
                r"|nvcc fatal\s*:\s*Value [`'‘](native)['’] is not defined for option "
                r"[`'‘]?gpu-architecture", FLAGS),
     "toolkit.nvcc-too-old-for-torch", ("option", "option")),
    # CMake < 3.24 passes CUDA_ARCHITECTURES=native through as an arch name (or an empty one)
    (re.compile(r"Unsupported gpu architecture [`'‘\"]?(compute_native)['’\"]?|arch=(compute_native)"
                r"\b|Id flags:[^\n]*arch=(compute_),code=sm_", FLAGS),
     "toolkit.cmake-too-old-for-native-arch", ("arch", "arch", "arch")),
    # a GCC older than the C++ standard the build asks for (GCC 4.x: no -std=c++14/gnu++14/c++1z)
    (re.compile(r"unrecognized command[- ]line option [`'‘\"]-std=((?:c|gnu)\+\+(?:0x|11|1[47yz]|"
                r"2[0a]))['’\"]", FLAGS),
     "toolkit.gcc-too-old-for-torch", ("standard",)),
    # glibc >= 2.34's stdio.h (__malloc__ with arguments) under an nvcc 11.4/11.5 front end
    (re.compile(r"(/usr/include/[\w/.+-]+\.h)\(\d+\): error: attribute \"(?:__malloc__|malloc)\" "
                r"does not take\s+arguments", FLAGS),
     "toolkit.gcc-headers-break-nvcc", ("header",)),
    # torch 2.6 removed DeprecatedTypeProperties' conversion to ScalarType: AT_DISPATCH over
    # x.type() in a source written for older torch
    (re.compile(r"(?:no suitable conversion function from|cannot convert) [\"“‘'`]?const "
                r"(at::DeprecatedTypeProperties)[\"”’'`]? to [\"“‘'`]?c10::ScalarType", FLAGS),
     "toolkit.ext-source-older-than-torch", ("removed_api",)),
    # torch >= 2.9's compiled_autograd.h under MSVC without USE_CUDA: 'std' ambiguous
    (re.compile(r"(compiled_autograd\.h)\(\d+\): error C2872: [`'‘]std[’'`]: ambiguous symbol",
                FLAGS), "toolkit.windows-torch-header-std-ambiguous", ("header",)),
    # torch's extension builder probing for MSVC with `where cl` (Windows' `which c++`)
    (re.compile(r"Command [`'‘]\[[`'‘]where[’'`], [`'‘](cl(?:\.exe)?)[’'`]\][’'`] returned non-zero "
                r"exit status", FLAGS), "toolkit.cxx-compiler-missing", ("compiler",)),
    # a serialized TensorRT engine loaded by another TensorRT release, or on a GPU of another
    # compute capability than the one it was built on: engines are rebuilt, not converted
    (re.compile(r"The engine plan file is not compatible with this version of TensorRT, expecting "
                r"library version (\d+\.\d+\.\d+(?:\.\d+)?) got (?!0\.0\.0\b)(\d+\.\d+\.\d+"
                r"(?:\.\d+)?)|Current Version: (\d+), Serialized Engine Version: (\d+)", FLAGS),
     "toolkit.tensorrt-engine-version-mismatch", ("runtime", "engine", "runtime", "engine")),
    (re.compile(r"The engine plan file is generated on an incompatible device, expecting compute "
                r"(\d+\.\d+) got compute (\d+\.\d+)", FLAGS),
     "toolkit.tensorrt-engine-built-for-other-gpu", ("device_compute", "engine_compute")),
    # Triton's own version parse of `ptxas --version`: a CUDA newer than that Triton knows
    # (12.8 read as below 10.0), not an old one
    (re.compile(r"Triton only supports? CUDA 10\.0 or higher, but got CUDA version: (\d+\.\d+)",
                FLAGS), "toolkit.ptxas-newer-than-triton", ("ptxas_cuda",)),
    # ggml's CMake refusing the CUDA option names llama.cpp and whisper.cpp used before GGML_CUDA
    (re.compile(r"\b((?:LLAMA|WHISPER)_[A-Z0-9_]+) is deprecated and will be removed in the future",
                re.MULTILINE), "toolkit.ggml-cuda-option-renamed", ("option",)),
    # nvcc's host_config.h on a clang past its range, and nvcc's own refusal of (Apple) clang by
    # its encoded version (a clang 2.x below 30000 is the other way: too old, not this)
    (re.compile(r"unsupported clang version! clang version must be less than (\d+)|The version "
                r"\('(?![12]\d{4}'\))(\d+)(?:\.\d+)*'\) of the host compiler \('(?:Apple )?clang'\) "
                r"is not supported", FLAGS), "jit.gcc-too-new-for-nvcc", ("below", "clang")),
    # Visual Studio updated past the CUDA toolkit: nvcc's host_config.h refuses the MSVC, or the
    # MSVC STL's yvals_core.h refuses the nvcc (STL1002 names the CUDA it needs)
    (re.compile(r"CUDA[\\/]v(\d+\.\d+)[\\/]include[\\/]crt[\\/]host_config\.h[^\n]*\n?[^\n]*?"
                r"unsupported Microsoft Visual Studio version|unsupported Microsoft Visual Studio "
                r"version|STL1002: Unexpected compiler version, expected CUDA (\d+\.\d+(?: Update \d)?)",
                FLAGS), "toolkit.msvc-cuda-version-mismatch", ("cuda", "needs_cuda")),
    # glibc 2.41's C23 math declarations (noexcept) against CUDA <= 12.9's crt/math_functions.h
    (re.compile(r"exception\s+specification\s+is\s+incompatible\s+with\s+that\s+of\s+previous"
                r"\s+function\s+\"((?:cospi|sinpi|rsqrt)f?)\"|exception\s+specification\s+is\s+"
                r"incompatible\s+with\s+that\s+of\s+previous\s+function\s+\"\w+\"\s*\(declared"
                r"\s+at\s+line\s+\d+\s+of\s+[^)]*crt/math_functions\.h\)", FLAGS),
     "toolkit.glibc-too-new-for-cuda-headers", ("function",)),
    # nvcc's front end on a newer gcc's own headers (its version check bypassed)
    (re.compile(r"/include/c\+\+/(\d+)[\w.]*/[\w./+-]+(?:\(\d+\))?: error:\s+(?:identifier\s+"
                r"\"(?:__\w+|char(?:8|16|32)_t|false_type|true_type)\"\s+is\s+undefined|user-defined"
                r"\s+literal\s+operator\s+not\s+found|__bool_constant\s+is\s+not\s+a\s+template)",
                FLAGS), "jit.gcc-too-new-for-nvcc", ("gcc",)),
)


# An extension build (a Dockerfile RUN of pip/setup.py, pip building a wheel from setup.py,
# torch's extension builder) where torch finds no GPU: `docker build` never sees one, and torch
# 1.3-1.7 probed the GPU's arch there and raised the driver's words (newer torch: NO_ARCH).
EXT_BUILD_STEP = re.compile(r"(?:^|: )RUN\b[^\n]*\b(?:pip3? install|setup\.py|make\.sh)\b"
                            r"|Building wheel for \S+ \(setup\.py\)|_get_cuda_arch_flags"
                            r"|\bcpp_extension\.py\b", FLAGS)
NO_GPU_SEEN = re.compile(NO_DRIVER.pattern + "|" + dict(KINDS)["no-device"], FLAGS)


def ext_build_without_gpu(message: str, around: str = "") -> tuple[str, str] | None:
    """(torch's no-GPU words, the build step) when torch found no GPU in an extension build:
    the words in the line or the lines around it, the step anywhere there. The gpu family asks
    it too, so that such a build is not read as a node without GPUs."""
    none = NO_GPU_SEEN.search(message) or NO_GPU_SEEN.search(around)
    step = none and EXT_BUILD_STEP.search(f"{around}\n{message}")
    return (none.group(0), step.group(0).strip()[:80]) if step else None


@cache
def library_headers() -> tuple[tuple[re.Pattern, dict], ...]:
    """(the include path's pattern, its row of headers.toml) for each third-party library."""
    rows = load_table("dsenv.doctor.explain", "headers.toml")["header"]
    return tuple((re.compile(row["match"]), row) for row in rows)


def missing_headers(message: str) -> list[tuple[str, str]]:
    """(the compiler's words, the include path) of each header the build could not open."""
    return [(m.group(0).strip(), next(g for g in m.groups() if g))
            for m in ANY_HEADER.finditer(message)]


def library_header(missing: list[tuple[str, str]]) -> tuple[str, str, dict] | None:
    """(the compiler's words, the include path, the library's row) of the first missing header
    a third-party library ships."""
    for text, path in missing:
        for pattern, row in library_headers():
            if pattern.search(path):
                return text, path, row
    return None


def compile_readings(message: str) -> list[Reading]:
    # Which op was being built (ninja's "Error building extension") and which object failed
    # ("FAILED: x.o"): said with whatever first error the build printed.
    op, failed = EXTENSION.search(message), FAILED_OBJECT.search(message)
    where = {"op": op.group(1) if op else "", "file": failed.group(1) if failed else ""}
    found = []
    for words, mode, names in TOOLCHAIN:
        if hit := words.search(message):
            parts = {n: g for n, g in zip(names, hit.groups(), strict=True) if g}
            found.append(reading(FAMILY, mode, hit.group(0)[:160], **parts, **where))
    missing = missing_headers(message)
    owner = ""
    if missing:
        text, path = missing[0]
        name = path.rsplit("/", 1)[-1]
        # The header names the package that lacks its development files.
        owner = ("toolkit.python-headers-missing" if name in ("Python.h", "pyconfig.h")
                # hipcc compiling for a gfx target includes no CUDA header once a source is
                # hipified: a CUDA header asked for there is a source left un-hipified
                else "" if CUDA_HEADER.match(path) and HIP_COMPILE.search(message)
                else "toolkit.cuda-headers-missing" if CUDA_HEADER.match(path)
                else "toolkit.nccl-headers-missing" if name == "nccl.h"
                else "toolkit.cudnn-headers-missing" if CUDNN_HEADER.match(name)
                else "deepspeed.async-io-no-libaio" if name == "libaio.h"
                # Python.h of 3.7-3.9 includes <crypt.h>, which glibc >= 2.38 and
                # conda's sysroots no longer ship (libxcrypt's now)
                else "toolkit.crypt-h-missing" if name == "crypt.h" else "")
        if name == "cudnn_frontend.h" or path.startswith(("cute/", "cutlass/")):
            # headers a source tree carries as git submodules (cudnn-frontend, CUTLASS)
            owner = "toolkit.source-submodules-missing"
        if name in CUDA_HEADER_SINCE:
            found.append(_newer_cuda_header(message, text, name, where))
        elif owner:
            found.append(reading(FAMILY, owner, text, header=name, **where))
    if not owner and (library := library_header(missing)):
        text, path, row = library
        found.append(reading(FAMILY, "toolkit.library-headers-missing", text, header=path,
                             library=row["library"], apt=row["apt"], dnf=row["dnf"],
                             conda=row["conda"], **where))
    killed = KILLED.search(message)
    if killed:  # signal 9 to a compiler: the OOM killer during a parallel build
        found.append(reading(FAMILY, "jit.build-oom-parallel", killed.group(0),
                             killed=next(g for g in killed.groups() if g), **where))
    compiler = NO_COMPILER.search(message)
    if compiler:
        found.append(reading(FAMILY, "toolkit.cxx-compiler-missing", compiler.group(0),
                             compiler=next(g for g in compiler.groups() if g), **where))
    march = MARCH_NATIVE.search(message)
    if march:
        found.append(reading(FAMILY, "toolkit.march-native-non-x86", march.group(0).strip(),
                             compiler=march.group(1) or "not named", flag=march.group(2), **where))
    probe = WINDOWS_PROBE.search(message)
    if probe:
        found.append(reading(FAMILY, "deepspeed.windows-no-aio-gds", probe.group(0),
                             library=probe.group(1)))
    return found + _toolkit_readings(message, where)


def _newer_cuda_header(message: str, text: str, name: str, where: dict) -> Reading:
    """A header only newer toolkits ship: a toolkit older than its first release is too old
    for the code (alternatives.toml cuda-header-too-new lists a root without headers second);
    one that ships it, named in the log, means the build reads another root's headers."""
    since = CUDA_HEADER_SINCE[name]
    needs = f"CUDA {since[0]}.{since[1]}"
    seen = next(((int(m[i]), int(m[i + 1])) for m in CUDA_RELEASE_SEEN.finditer(message)
                 for i in range(1, len(m.groups()), 2) if m[i]), None)
    if seen is not None and seen >= since:
        return reading(FAMILY, "toolkit.cuda-headers-missing", text, header=name,
                       first_shipped=needs, toolkit_named=f"CUDA {seen[0]}.{seen[1]}", **where)
    return reading(FAMILY, "toolkit.cuda-too-old-for-header", text, header=name,
                   first_shipped=needs,
                   toolkit=f"CUDA {seen[0]}.{seen[1]}" if seen else "not named in the log",
                   **where)
