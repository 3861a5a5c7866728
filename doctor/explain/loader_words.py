"""The dynamic loader's and linker's words for a library that failed: what loader.py reads
from a message (the library, the symbol and its version, the program that asked), in each
wording the loader, dlopen wrappers and the frameworks that load libraries by name print."""

from __future__ import annotations

import re

LIB = r"(lib[\w+.-]*?\.so(?:\.[\w.]+)?)"
# Windows names the same libraries <name>64_<major>.dll (cublas64_12.dll, cudart64_110.dll,
# cudnn_ops_infer64_8.dll): read as their Linux soname (linux_name), so one table row serves both
WIN_DLL = r"((?:cu\w+?|nvrtc\w*?|nccl)64_\d+\.dll)"
MISSING = re.compile(
    r"(?:(?P<path>/\S*/)|\b)" + LIB + r"(?:'|\"|:|,)?\s*(?:: )?cannot open shared object file"
    r"|Could not load dynamic library '" + LIB + "'"
    r"|load library failed: " + LIB
    + r"|failed to (?:load|open|dlopen) " + LIB  # dlopen wrappers (cuda-python's "Failed to
    # dlopen X"); NVRTC's "failed to open X."
    + r"|(?:Couldn't|Could not|Unable to) (?:open|load|find) (?:the )?(?:CUDA |dynamic |shared )?"
      r"library:? '?" + LIB
    # CTranslate2 (faster-whisper, whisperX): "Library libcublas.so.12 is not found or cannot be
    # loaded" (SYSTRAN/faster-whisper#47, OpenNMT/CTranslate2#1250)
    + r"|\bLibrary " + LIB + r" is not found or cannot be loaded"
    # the same on Windows: CTranslate2's words, cuDNN 8's own loader, TensorFlow's
    + r"|\bLibrary " + WIN_DLL + r" is not found or cannot be loaded|Could not (?:locate|load "
      r"library|load dynamic library) '?" + WIN_DLL, re.IGNORECASE)


def linux_name(library: str) -> str:
    """A Windows CUDA DLL's name as its Linux soname (cudart64_110.dll -> libcudart.so.11.0,
    cublas64_12.dll -> libcublas.so.12); any other name unchanged."""
    m = re.fullmatch(r"(\w+?)64_(\d+)\.dll", library, re.IGNORECASE)
    if not m:
        return library
    major = m[2] if len(m[2]) < 3 else f"{m[2][:-1]}.{m[2][-1]}"  # 110: CUDA 11.0's runtime
    return f"lib{m[1]}.so.{major}"
UNDEFINED = re.compile(
    r"(?:(?P<by>[^\s`'\"]+\.so[\w.]*):\s*)?undefined\s+symbol:\s*[\"'`]?(?P<sym>[\w@.$]+)[\"'`]?"
    r"(?:,\s*version\s+(?P<ver>[\w.+-]+))?")
# glibc's other wording of the same failure, when the file has version definitions but not
# this symbol's: "libcublas.so.11: symbol cublasLtHSHMatmulAlgoInit, version libcublasLt.so.11
# not defined in file libcublasLt.so.11 with link time reference" (after "relocation error:")
NOT_DEFINED = re.compile(
    r"(?:(?P<by>[^\s`'\"]+\.so[\w.]*):\s*)?symbol\s+(?P<sym>[\w@.$]+),?\s+version\s+"
    r"(?P<ver>[\w.+-]+)\s+not defined in file\s+\S+\s+with link time reference")
VERSION = re.compile(
    r"(?:(?P<lib>\S*" + LIB + r"):\s*)?version [`'‘]?(?P<ver>(?:GLIBCXX|GLIBC|CXXABI|CUDA|"
    r"libcublas|NCCL|IBVERBS|MPI)[\w.]*)['’] not found(?: \(required by (?P<by>[^)]+)\))?")
# The link step's "no such library" in each linker's words: GNU ld's and gold's "cannot find
# -lX", LLVM lld's "unable to find library -lX" (ROCm's and clang's builds), Apple ld64's
# "library not found for -lX".
LINK = re.compile(r"(?:cannot find|unable to find library|library not found for) "
                  r"-l(?P<name>[\w+.-]+?)(?=[:\s'\"]|$)")
