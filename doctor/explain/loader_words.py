"""The dynamic loader's and linker's words for a library that failed: what loader.py reads
from a message (the library, the symbol and its version, the program that asked), in each
wording the loader, dlopen wrappers and the frameworks that load libraries by name print."""

from __future__ import annotations

import re

LIB = r"(lib[\w+.-]*?\.so(?:\.[\w.]+)?)"
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
    + r"|\bLibrary " + LIB + r" is not found or cannot be loaded", re.IGNORECASE)
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
