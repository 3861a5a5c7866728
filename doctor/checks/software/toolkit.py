"""toolkit: nvcc/hipcc against torch, CUDA_HOME/ROCM_PATH, C++ compiler and ninja, archs."""

from __future__ import annotations

import re
from pathlib import Path

from dsenv.doctor.catalogue import mode_finding, mode_id
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.envs import archs
from dsenv.facts.gpu import inventory as gpu_probe
from dsenv.facts.python import torch_info as tp
from dsenv.facts.toolchain import arch_readers as ar
from dsenv.facts.toolchain import toolkit as tk
from dsenv.facts.toolchain.arch_parsers import dropped
from dsenv.verdicts.findings import fail, info, ok, skip, warn
from dsenv.versions import version_tuple


def _compiler_check(ctx: Context, tool: tk.Tool, kind: str, torch_version: str | None):
    """nvcc (kind 'cuda') or hipcc (kind 'hip') against torch's CUDA/HIP version."""
    build = tp.torch_build(ctx)
    label = {"cuda": "CUDA", "hip": "ROCm/HIP"}[kind]
    where = f"{tool.path} (found via {tool.how})" if tool.found else tool.how
    if build.kind == "none":
        return skip(f"{tp.NOT_INSTALLED}: see torch.build")
    if build.kind == "cpu":
        state = f"{tool.name} {tool.version} at {tool.path}" if tool.found else f"no {tool.name}"
        return info(f"torch is a CPU build, so {tool.name} is not used ({state})")
    if build.kind != kind:
        return skip(f"{build.describe()}: {tool.name} is not used")
    module = f"module load {'cuda' if kind == 'cuda' else 'rocm'}/{torch_version}"
    if not tool.found or tool.version is None:
        finding = fail if ctx.is_compute else warn
        return finding(f"{tool.name} not usable: DeepSpeed cannot JIT-compile {label} ops "
                       "that are not precompiled", f"`{module}` (the toolkit matching "
                       f"torch's {label} {torch_version}) or set "
                       f"{'CUDA_HOME' if kind == 'cuda' else 'ROCM_PATH'}", where)
    wanted = int(torch_version.split(".")[0])
    summary = f"{tool.name} {tool.version}, torch built with {label} {torch_version}"
    if tool.major != wanted:
        summary = (f"{summary}: the majors differ, DeepSpeed refuses to JIT-compile "
                   "('Installed CUDA version ... does not match the version torch was "
                   "compiled with')")
        here = (f"`{module}`, or point {'CUDA_HOME' if kind == 'cuda' else 'ROCM_PATH'} at a "
                f"{wanted}.x toolkit")
        if kind != "cuda":
            return fail(summary, here, where)
        # an nvcc before 11 also lacks -std=c++17, which torch 2's extensions ask for
        return mode_finding(fail, "toolkit.nvcc-too-old-for-torch" if tool.major < 11 < wanted
                            else "jit.cuda-major-mismatch", summary, where, here=here)
    return ok(summary, where)


@check("toolkit.nvcc", "nvcc matches torch's CUDA")
def nvcc(ctx: Context):
    return _compiler_check(ctx, tk.nvcc(ctx), "cuda", tp.torch_build(ctx).cuda)


@check("toolkit.hipcc", "hipcc matches torch's HIP")
def hipcc(ctx: Context):
    return _compiler_check(ctx, tk.hipcc(ctx), "hip", tp.torch_build(ctx).hip)


HOME_VARIABLES = {"cuda": (("CUDA_HOME", "CUDA_PATH"), "nvcc", tk.nvcc),
                  "hip": (("ROCM_HOME", "ROCM_PATH"), "hipcc", tk.hipcc)}


@check("toolkit.cuda-home", "CUDA_HOME / ROCM_PATH")
def cuda_home(ctx: Context):
    build = tp.torch_build(ctx)
    if not build.installed:
        return skip(f"{tp.NOT_INSTALLED}: no GPU toolkit needed")
    if build.kind not in HOME_VARIABLES:
        return skip(f"{build.describe()}: no GPU toolkit needed")
    variables, binary, locate = HOME_VARIABLES[build.kind]
    tool = locate(ctx)
    setting = next((v for v in variables if ctx.env.get(v)), None)
    if setting:
        home = ctx.env[setting]
        if tk.home_binary(ctx, setting, binary) is None:
            summary = (f"{setting}={home} has no bin/{binary}: torch and DeepSpeed build "
                       "with a broken toolkit path")
            here = f"point {setting} at the toolkit root (the folder holding bin/{binary}), or unset it"
            if build.kind != "cuda":
                return fail(summary, here)
            return mode_finding(fail, "toolkit.cuda-home-malformed" if ":" in home
                                else "jit.cuda-home-missing", summary, here=here)
        return ok(f"{setting}={home}")
    if tool.found:
        return ok(f"{'/'.join(variables)} unset; torch will use {tool.home} ({tool.how})")
    finding = fail if ctx.is_compute else warn
    summary = f"{'/'.join(variables)} unset and no {binary} found"
    here = (f"load the toolkit module (`module load {'cuda' if build.kind == 'cuda' else 'rocm'}`)"
            f" or export {variables[0]}=/path/to/toolkit")
    if build.kind != "cuda":
        return finding(summary, here)
    return mode_finding(finding, "jit.cuda-home-missing", summary, here=here)


@check("toolkit.compiler", "C++ compiler and ninja for JIT builds")
def compiler(ctx: Context):
    cxx, ninja = tk.cxx(ctx), tk.ninja(ctx)
    evidence = [f"{cxx.name}: {cxx.path or '-'} ({cxx.how})", f"ninja: {ninja.path or '-'} "
                f"({ninja.how})"]
    missing = []
    if not cxx.found:
        missing.append(f"no C++ compiler ({cxx.how})")
    if not ninja.found:
        missing.append("ninja " + ("is installed as a Python package but its binary is not on "
                                   "PATH" if ninja.version else "is missing"))
    if missing:
        fix = ("`pip install ninja` and run from the activated environment (its bin/ on PATH)"
               if cxx.found else "load a compiler (`module load gcc`) or `apt install g++`")
        finding = fail if ctx.is_compute else warn
        if not cxx.found:  # ninja alone is toolkit.ninja's (jit.ninja-missing)
            return mode_finding(finding, "toolkit.cxx-compiler-missing",
                                "; ".join(missing) + ": DeepSpeed cannot JIT-compile its ops",
                                *evidence, here=fix)
        return finding("; ".join(missing) + ": DeepSpeed cannot JIT-compile its ops", fix,
                       *evidence)
    too_old = _gcc_too_old(ctx, cxx)
    if too_old:
        minimum, build = too_old
        return mode_finding(fail if ctx.is_compute else warn, "toolkit.gcc-too-old-for-torch",
                            f"{cxx.name} {cxx.version} is older than torch {build.version} "
                            f"builds extensions with (g++ {minimum} or newer): every DeepSpeed "
                            "op build stops", *evidence,
                            f"{build.location}/utils/cpp_extension.py: minimum {minimum}",
                            here=f"`module load gcc` (g++ {minimum} or newer) or `conda install "
                            "-c conda-forge gxx`, then export CXX=g++ from it")
    too_new = _gcc_too_new(ctx, cxx)
    if too_new:
        limit, header = too_new
        return mode_finding(fail if ctx.is_compute else warn, "jit.gcc-too-new-for-nvcc",
                            f"{cxx.name} {cxx.version} is newer than nvcc accepts (gcc {limit} "
                            "at most): CUDA ops stop with '#error -- unsupported GNU version!'",
                            *evidence, f"{header}: `#if __GNUC__ > {limit}` -> #error",
                            here=f"export CC=gcc-{limit} CXX=g++-{limit} (or "
                            f"NVCC_PREPEND_FLAGS='-ccbin g++-{limit}')")
    return ok(f"{cxx.name} {cxx.version}, ninja {ninja.version}", *evidence)


def _is_gcc(cxx: tk.Tool) -> bool:
    return bool(cxx.major) and ("GCC" in cxx.how or "g++" in cxx.how)


def _gcc_too_old(ctx: Context, cxx: tk.Tool) -> tuple[str, tp.TorchBuild] | None:
    """(the oldest g++ the judged torch accepts, that torch) when ``cxx`` is an older GCC;
    None when it is not GCC, torch is not installed or does not say."""
    build = tp.torch_build(ctx)
    if not _is_gcc(cxx) or not build.installed:
        return None
    minimum = tk.gcc_minimum_of_torch(build.location, build.cuda)
    if not minimum or version_tuple(cxx.version) >= minimum:
        return None
    return ".".join(map(str, minimum)), build


def _gcc_too_new(ctx: Context, cxx: tk.Tool) -> tuple[int, str] | None:
    """(the newest gcc major nvcc accepts, the header that says so) when ``cxx`` is a GCC
    newer than that; None otherwise (no nvcc, not GCC, or nvcc told to accept it)."""
    flags = ctx.env.get("NVCC_PREPEND_FLAGS", "") + " " + ctx.env.get("NVCC_APPEND_FLAGS", "")
    if not _is_gcc(cxx) or "-allow-unsupported-compiler" in flags or "-ccbin" in flags:
        return None
    nvcc = tk.nvcc(ctx)
    if not nvcc.found or not nvcc.home:
        return None
    header = Path(nvcc.home, "include", "crt", "host_config.h")
    try:
        text = header.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"__GNUC__\s*>\s*(\d+)", text)
    if found is None or cxx.major <= int(found.group(1)):
        return None
    return int(found.group(1)), str(header)


def _targets(ctx: Context) -> tuple[dict[str, str], list[str]]:
    """{arch: why} for visible NVIDIA GPUs and TORCH_CUDA_ARCH_LIST; plus unparsable entries."""
    targets = {g.arch: f"visible GPU {g.name}" for g in gpu_probe.visible_gpus(ctx)
               if g.vendor == "nvidia" and g.arch}
    value = ctx.env.get("TORCH_CUDA_ARCH_LIST")
    unknown: list[str] = []
    if value:
        listed, unknown = tk.parse_arch_list(value)
        for arch in listed:
            targets.setdefault(arch, f"TORCH_CUDA_ARCH_LIST={value!r}")
    return targets, unknown


def _readers_culprits(readers: ar.ArchReaders | None, nvcc_span: str
                      ) -> tuple[list[str], list[str], list[str], list[str]]:
    """(summary clauses, fixes, evidence, the clauses' catalogue modes) for the entries torch's extension builder or
    DeepSpeed's op builders cannot read, as asked in the environment under test."""
    if readers is None:
        return [], [], [], []
    clauses, fixes, evidence, modes = [], [], [readers.note], []
    if readers.torch_rejects:
        named = ", ".join(readers.torch_rejects)
        clauses.append(f"torch {readers.torch}'s extension builder cannot read {named}")
        modes.append(mode_id("toolkit.arch-unknown-to-torch"))
        fixes.append(f"drop or respell {named} in TORCH_CUDA_ARCH_LIST as numbers torch "
                     f"{readers.torch} knows (e.g. \"9.0\")")
        evidence += [f"torch: {e}: {why}" for e, why in readers.torch_rejects.items()]
    ds_only = {e: why for e, why in readers.deepspeed_rejects.items()
               if e not in readers.torch_rejects}
    if ds_only:
        named = ", ".join(ds_only)
        why = next(iter(ds_only.values())) + (f" at {readers.where}" if readers.where else "")
        others = " and ".join(([f"torch {readers.torch}"] if readers.torch else []) +
                              [nvcc_span.split(" builds")[0]])
        clauses.append(f"DeepSpeed {readers.deepspeed}'s op builders cannot read {named} "
                       f"({why}), while {others} can")
        modes.append(mode_id("jit.arch-list-variant"))
        spelled = readers.translated or ar.plain_spelling(list(ds_only))
        fixes.append(f"`dsenv smoke` and `dsenv run` hand DeepSpeed {spelled} instead and say "
                     f"so; for your own `deepspeed` launch, `export TORCH_CUDA_ARCH_LIST="
                     f"\"{spelled}\"` (that drops {dropped(ds_only)})")
        evidence += [f"DeepSpeed: {e}: {why}" for e, why in ds_only.items()]
    return clauses, fixes, evidence, modes


@check("toolkit.arch-support", "Archs nvcc, torch and DeepSpeed build")
def arch_support(ctx: Context):
    """Every target arch (visible GPUs, TORCH_CUDA_ARCH_LIST) against each program that
    reads it: nvcc (the toolkit table), torch's extension builder and DeepSpeed's op
    builders (asked in the environment under test, dsenv/facts/toolchain/arch_readers.py)."""
    tool = tk.nvcc(ctx)
    if not tool.found or tool.version is None:
        return skip("no usable nvcc: see toolkit.nvcc")
    row = tk.toolkit_row(tool.version)
    if row is None:
        return warn(f"nvcc {tool.version} is not in envs/cuda_toolkits.toml", "update dsenv")
    span = f"nvcc {tool.version} builds compute capability {row.min_arch} to {row.max_arch}"
    targets, unknown = _targets(ctx)
    readers = ar.readers(ctx)
    clauses, fixes, evidence, modes = _readers_culprits(readers, span)
    unknown = [u for u in unknown if readers is None or u not in readers.torch_rejects]
    if unknown:
        clauses.insert(0, f"TORCH_CUDA_ARCH_LIST has entries that name no compute capability: "
                       f"{', '.join(unknown)}")
        fixes.insert(0, "use numbers like `export TORCH_CUDA_ARCH_LIST=\"8.0;9.0\"`")
        modes.insert(0, mode_id("toolkit.arch-unknown-to-torch"))
    bad = {a: why for a, why in targets.items() if not tk.can_build(row, a)}
    if bad:
        arch, why = sorted(bad.items())[0]
        able = tk.toolkits_for(arch)
        other = (f"load a CUDA {able[-1].split('.')[0]}.x toolkit module "
                 f"(`module load cuda/{able[-1]}`)" if able else "no CUDA toolkit builds it")
        drop = " or drop it from TORCH_CUDA_ARCH_LIST" if "TORCH_CUDA_ARCH_LIST" in why else ""
        clauses.insert(0, f"{span}: cannot build {', '.join(sorted(bad))} ({why})")
        fixes.insert(0, other + drop)
        modes.insert(0, mode_id("toolkit.arch-too-old-for-nvcc")
                     if (archs.cuda_capability(arch) or (0, 0)) < archs.cuda_capability(row.min_arch)
                     else mode_id("toolkit.arch-too-new-for-nvcc"))
        evidence = [f"{a}: {w}" for a, w in sorted(bad.items())] + evidence
    if clauses:  # the first clause's mode leads; each clause's own fix is a "here:" line
        return mode_finding(fail, modes[0], "; ".join(clauses), span, *evidence, here=fixes)
    if not targets:
        return info(f"{span}; no GPU or TORCH_CUDA_ARCH_LIST to check against")
    return ok(f"{span}: covers {', '.join(sorted(targets, key=version_tuple))}", *evidence)


@check("toolkit.arch-list", "TORCH_CUDA_ARCH_LIST covers the GPUs")
def arch_list(ctx: Context):
    """The compute capabilities TORCH_CUDA_ARCH_LIST builds for, against the GPUs this job
    sees: a build with a list that leaves one out (8.0 on V100s) holds no kernel it can run."""
    value = ctx.env.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if not value:
        return skip("TORCH_CUDA_ARCH_LIST is not set: torch's extension builder and "
                    "DeepSpeed's op builders build for the GPUs they see")
    gpus = [g for g in gpu_probe.visible_gpus(ctx) if g.vendor == "nvidia"]
    if not gpus:
        return skip(f"no NVIDIA GPU visible: nothing to hold TORCH_CUDA_ARCH_LIST={value} "
                    "against here (run the doctor on a compute node of the job)")
    code, unknown = tk.arch_list_code(value)
    evidence = [f"TORCH_CUDA_ARCH_LIST={value} builds " + (" ".join(code) or "nothing")]
    evidence += [f"not understood (see toolkit.arch-support): {', '.join(unknown)}"] if unknown \
        else []
    unknown_arch = [g for g in gpus if not g.arch]
    judged = [g for g in gpus if g.arch]
    evidence += [f"GPU {g.index} {g.name}: compute capability unknown" for g in unknown_arch]
    if not judged:
        return skip("no visible GPU reported its compute capability", *evidence)
    missing, through_ptx = {}, set()
    for gpu in judged:
        entry = tp.covering_entry(code, gpu.arch)
        evidence.append(f"GPU {gpu.index} {gpu.name} ({gpu.arch}): "
                        + (f"runs {entry}" if entry else "no code in the list runs here"))
        if entry is None:
            missing.setdefault(gpu.arch, gpu.name)
        elif entry.startswith("compute_"):
            through_ptx.add(gpu.arch)
    if missing:
        shown = ", ".join(f"{name} ({arch})" for arch, name in sorted(missing.items()))
        wanted = ";".join(sorted(missing, key=version_tuple))
        return mode_finding(fail, "torch.arch-list-misses-gpu",
                            f"TORCH_CUDA_ARCH_LIST={value} leaves out {shown}: ops built with it "
                            "(DS_BUILD_OPS installs, DeepSpeed's JIT builds since 0.19, torch "
                            "extensions) stop there with 'no kernel image is available for "
                            "execution on the device'", *evidence,
                            here=f"add the GPU's arch: export TORCH_CUDA_ARCH_LIST=\"{wanted};"
                            f"{value}\" (or unset it to build for the GPUs the build sees), "
                            "then rebuild the ops (clear the JIT extensions folder, or "
                            "reinstall with DS_BUILD_OPS=1)")
    archs = ", ".join(sorted({g.arch for g in judged}, key=version_tuple))
    ptx = (f"; {', '.join(sorted(through_ptx, key=version_tuple))} only through PTX compiled "
           "at first use" if through_ptx else "")
    return ok(f"TORCH_CUDA_ARCH_LIST={value} covers the {len(judged)} visible GPU(s) "
              f"({archs}){ptx}", *evidence)
