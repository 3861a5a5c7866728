"""deepspeed.cpu-flags and its probe: what -march=native enables here, asked of the real
compiler, recorded in a real manifest; the check fails a node whose /proc/cpuinfo lacks a
recorded flag (the manifest edited to require one this CPU does not have) and passes its
healthy twin."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.facts.toolchain import cpu_isa
from dsenv.provision.ops.cache import cpu_record
from dsenv.provision.record.manifest import manifest_path, write_manifest
from dsenv.verdicts.findings import Status

GCC_LINE = (' /usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -E -quiet -imultiarch x86_64-linux-gnu '
            '-D_GNU_SOURCE - "-march=cooperlake" -mmmx -msse3 -msse4.1 -mavx2 -mno-sse4a '
            '-mavx512f -mbmi -mlzcnt -mno-amx-tile --param "l1-cache-size=48" '
            '"-mtune=generic" -fasynchronous-unwind-tables -dumpbase -')
CLANG_LINE = (' "/usr/lib/llvm-16/bin/clang" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-E" '
              '"-target-cpu" "skylake-avx512" "-target-feature" "+avx2" "-target-feature" '
              '"-amx-tile" "-target-feature" "+avx512f" "-tune-cpu" "generic" "-x" "c++" "-"')
MISSING = "dsenv_no_such_flag"  # no CPU has it


def test_parses_gcc_and_clang_expansions_of_march_native():
    march, options, enabled = cpu_isa.parse_driver_options(
        "Using built-in specs.\nCOLLECT_GCC=c++\n" + GCC_LINE + "\nCOLLECT_GCC_OPTIONS='x'\n")
    assert march == "cooperlake"
    assert enabled == ("mmx", "sse3", "sse4.1", "avx2", "avx512f", "bmi", "lzcnt")
    assert "--param=l1-cache-size=48" in options and "-mno-amx-tile" in options
    assert "-mtune=generic" in options
    assert [cpu_isa.cpuinfo_names(e, "x86_64") for e in ("sse3", "sse4.1", "bmi", "avx2")] == [
        ("pni",), ("sse4_1",), ("bmi1",), ("avx2",)]
    march, options, enabled = cpu_isa.parse_driver_options(CLANG_LINE)
    assert march == "skylake-avx512" and enabled == ("avx2", "avx512f")
    assert "-target-feature=-amx-tile" in options


@pytest.fixture(scope="module")
def native():
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler here")
    found = cpu_isa.native_isa()
    assert found is not None
    return found


def test_the_real_compiler_enables_only_flags_this_cpu_has(native):
    have = cpu_isa.host_cpu_flags()
    assert native.march and native.options and native.flags
    assert set(native.flags) <= have
    assert native.digest == cpu_isa.native_isa().digest  # the same answer twice
    if "avx2" in have:
        assert "avx2" in native.flags


def provisioned(prefix: Path, tmp_path: Path, cpu: dict) -> Path:
    lock = tmp_path / "cpu.txt"
    lock.write_text("torch==2.13.0+cpu\n")
    prefix.mkdir(parents=True, exist_ok=True)
    write_manifest(prefix, kind="venv", site="generic", stack="cpu", target={"spec": "cpu"},
                   lock_file=lock, ops_mode="cpu_adam", ops_requested=["cpu_adam"],
                   ops_installed=["cpu_adam"], versions={}, ops_extra={"cpu_flags": cpu},
                   command=["dsenv", "provision", "--arch", "cpu", "--ops", "cpu_adam"])
    return prefix


def ctx_for(prefix: Path, tmp_path: Path, target: str = "compute") -> Context:
    return Context(options=Options(target=target),
                   env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, python_prefix=prefix)


def require(prefix: Path, *flags: str) -> None:
    """Edit the manifest as a build on another CPU would have written it."""
    path = manifest_path(prefix)
    data = json.loads(path.read_text())
    data["ops"]["cpu_flags"]["flags"] += list(flags)
    path.write_text(json.dumps(data))


def test_a_node_with_every_recorded_flag_passes(native, tmp_path, run_one):
    prefix = provisioned(tmp_path / "env", tmp_path, cpu_record(native, ["cpu_adam"]))
    result = run_one("deepspeed.cpu-flags", ctx_for(prefix, tmp_path))
    assert result.status is Status.OK, result
    assert f"all {len(native.flags)} flags cpu_adam were compiled for" in result.summary
    assert f"-march={native.march}" in result.summary


def test_a_node_lacking_a_recorded_flag_fails_with_the_fix(native, tmp_path, run_one):
    prefix = provisioned(tmp_path / "env", tmp_path, cpu_record(native, ["cpu_adam"]))
    require(prefix, MISSING)
    result = run_one("deepspeed.cpu-flags", ctx_for(prefix, tmp_path))
    assert result.status is Status.FAIL, result
    assert f"lacks 1 flag(s) cpu_adam were compiled for ({MISSING})" in result.summary
    assert "SIGILL" in result.summary
    assert "dsenv provision --arch cpu --ops cpu_adam --force" in result.fix
    assert f"missing here: {MISSING}" in result.evidence
    # on a login node the job's compute nodes decide: a warning, same fix
    login = run_one("deepspeed.cpu-flags", ctx_for(prefix, tmp_path, "login"))
    assert login.status is Status.WARN and login.fix == result.fix


def test_nothing_to_judge_without_a_record(tmp_path, run_one):
    result = run_one("deepspeed.cpu-flags", ctx_for(tmp_path / "bare", tmp_path))
    assert result.status is Status.SKIP and "not provisioned by dsenv" in result.summary
    prefix = provisioned(tmp_path / "gpu-only", tmp_path, {})  # no -march=native op
    result = run_one("deepspeed.cpu-flags", ctx_for(prefix, tmp_path))
    assert result.status is Status.SKIP and "-march=native" in result.summary
    prefix = provisioned(tmp_path / "unsaid", tmp_path, cpu_record(None, ["cpu_adam"]))
    result = run_one("deepspeed.cpu-flags", ctx_for(prefix, tmp_path))
    assert result.status is Status.WARN and "re-provision" in result.fix
