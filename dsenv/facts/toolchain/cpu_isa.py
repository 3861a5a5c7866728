"""What ``-march=native`` means on this node: the CPU the compiler targets and the
instruction-set extensions it lets the code use, named as /proc/cpuinfo names them.

DeepSpeed compiles its CPU ops (cpu_adam, cpu_adagrad, cpu_lion, shm_comm, async_io, ...)
with ``-march=native`` (``OpBuilder.cpu_arch()`` in deepspeed/ops/op_builder/builder.py on
x86_64 and ARM), so a precompiled op may use every extension of the node that built it. The
compiler driver says which with ``-###``: it prints the cc1 command line it would run, where
gcc has expanded ``-march=native`` into ``-march=cooperlake -mavx512f -mno-amx-tile ...
--param l1-cache-size=48 -mtune=...`` (clang: ``-target-cpu X -target-feature +avx512f``).
Those options are also exactly what changes the compiled bytes, so provision keys its ops
cache on them. The compiler's extension names map to /proc/cpuinfo's through
envs/cpu_features.toml.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dsenv import proc
from dsenv.data import load_table
from dsenv.facts.host.machine import parse_proc_cpuinfo

NATIVE_TIMEOUT = 30.0


@dataclass(frozen=True)
class NativeIsa:
    compiler: str  # the compiler asked ("/usr/bin/c++")
    march: str  # what -march=native resolved to ("cooperlake"; "" when not said)
    options: tuple[str, ...]  # the target options the driver expanded it into, in order
    extensions: tuple[str, ...]  # enabled extensions, the compiler's names ("avx512f")
    flags: tuple[str, ...]  # the same, /proc/cpuinfo names this host shows ("avx512f", "pni")
    unmapped: tuple[str, ...] = ()  # enabled extensions with no flag in this host's cpuinfo

    @property
    def digest(self) -> str:
        """sha256 of the expanded options: equal digests, equal code generation."""
        return hashlib.sha256("\n".join(self.options).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"compiler": self.compiler, "march": self.march, "flags": list(self.flags),
                "unmapped": list(self.unmapped), "options_sha256": self.digest}


def cpuinfo_names(extension: str, arch: str | None = None) -> tuple[str, ...]:
    """/proc/cpuinfo's names for a compiler extension name (envs/cpu_features.toml)."""
    table = load_table("dsenv.envs", "cpu_features.toml").get(_arch_key(arch), {})
    row = table.get(extension)
    if row:
        return tuple(row["cpuinfo"])
    return (re.sub(r"[.-]", "_", extension),)


def _arch_key(arch: str | None) -> str:
    machine = (arch or platform.machine()).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def parse_driver_options(text: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(march, target options, enabled extensions) from ``CXX -march=native -### -E -``'s
    output (stderr): gcc's expanded cc1 line, or clang's -target-cpu/-target-feature."""
    # the compiler proper's line: gcc's cc1/cc1plus, clang's `clang -cc1`
    line = next((ln for ln in text.splitlines()
                 if re.search(r"(/cc1(plus)?\"?\s|\"?-cc1\"?\s)", ln)
                 and not ln.startswith(("COLLECT_", "Configured", "Target:"))), "")
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    march, options, enabled = "", [], []
    index = 0
    while index < len(words):
        word = words[index]
        nxt = words[index + 1] if index + 1 < len(words) else ""
        if word.startswith(("-march=", "-mcpu=", "-mtune=")):
            options.append(word)
            if word.startswith(("-march=", "-mcpu=")):
                base, *extras = word.split("=", 1)[1].split("+")
                march = march or base
                enabled += [e for e in extras if not e.startswith("no")]
        elif word == "--param" and nxt:
            options.append(f"--param={nxt}")
            index += 1
        elif word in ("-target-cpu", "-tune-cpu") and nxt:
            options.append(f"{word}={nxt}")
            march = march or (nxt if word == "-target-cpu" else "")
            index += 1
        elif word == "-target-feature" and nxt:
            options.append(f"{word}={nxt}")
            if nxt.startswith("+"):
                enabled.append(nxt[1:])
            index += 1
        elif re.fullmatch(r"-m(no-)?[a-z0-9][a-z0-9.\-]*", word) and not word.startswith(
                ("-mtune", "-march", "-mcpu")):
            options.append(word)
            if not word.startswith("-mno-"):
                enabled.append(word[2:])
        index += 1
    return march, tuple(options), tuple(dict.fromkeys(enabled))


def native_isa(cxx: str | None = None, env: Mapping[str, str] | None = None,
               cpu_flags: Iterable[str] | None = None,
               timeout: float = NATIVE_TIMEOUT) -> NativeIsa | None:
    """-march=native on this host, asked of ``cxx`` (default $CXX, else c++). None when
    there is no compiler or it does not take -march=native (PowerPC gcc wants -mcpu).
    ``cpu_flags``: this host's /proc/cpuinfo flags (read here when not given); an enabled
    extension whose name this host's cpuinfo does not show goes to ``unmapped``."""
    env = dict(os.environ if env is None else env)
    name = cxx or env.get("CXX") or "c++"
    path = proc.which(name, env) or (name if os.path.isabs(name) else None)
    if path is None:
        return None
    result = proc.run([path, "-march=native", "-###", "-E", "-x", "c++", "-"],
                      timeout=timeout, env=env)
    if not result.ok:
        return None
    march, options, extensions = parse_driver_options(result.stderr + "\n" + result.stdout)
    if not options:
        return None
    have = set(host_cpu_flags() if cpu_flags is None else cpu_flags)
    flags, unmapped = [], []
    for extension in extensions:
        names = cpuinfo_names(extension)
        if have and all(n in have for n in names):
            flags += names
        else:
            unmapped.append(extension)
    return NativeIsa(path, march, options, extensions, tuple(dict.fromkeys(flags)),
                     tuple(unmapped))


def host_cpu_flags(root: str = "/") -> frozenset[str]:
    """This host's /proc/cpuinfo flags (x86 "flags", ARM "Features")."""
    try:
        with open(os.path.join(root, "proc/cpuinfo"), encoding="utf-8",
                  errors="replace") as handle:
            return parse_proc_cpuinfo(handle.read())[1]
    except OSError:
        return frozenset()


def missing_flags(required: Iterable[str], have: Iterable[str]) -> list[str]:
    """The required flags ``have`` lacks, in the order required."""
    present = set(have)
    return [flag for flag in dict.fromkeys(required) if flag not in present]
