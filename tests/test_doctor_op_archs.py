"""Device code per op: the .nv_fatbin reader, cuobjdump listings recorded from real builds
(tests/fixtures/cuda-build), and deepspeed.op-archs failing a GPU an op has no kernel for."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

import pytest

from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python import target_env
from dsenv.facts.toolchain import fatbin
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.nvcc import compile_so, needs_nvcc
from tests.harness.recorded import FIXTURES, fixture_text

BUILDS = FIXTURES / "cuda-build"


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump") or next(iter(sorted(glob.glob(
        "/usr/local/cuda*/bin/cuobjdump"))), None)
    return os.environ.get("CUOBJDUMP") or found


def listing(name: str) -> dict[str, fatbin.DeviceCode]:
    """A recorded build listing: {op: DeviceCode} from its `== op: FILE` sections."""
    ops: dict[str, list[str]] = {}
    current = None
    for line in fixture_text(f"cuda-build/{name}").splitlines():
        if line.startswith("== "):
            current = line[3:].split(":", 1)[0]
            ops[current] = []
        elif current is not None:
            ops[current].append(line)
    return {op: fatbin.parse_cuobjdump("\n".join(lines), op) for op, lines in ops.items()}


# -- the reader -----------------------------------------------------------------------------
@needs_nvcc
def test_reader_finds_sass_and_ptx_of_a_real_object(tmp_path):
    so = compile_so(tmp_path, "k", "arch=compute_80,code=sm_80",
                    "arch=compute_90,code=[sm_90,compute_90]")
    code = fatbin.read_device_code(so)
    assert (code.elf, code.ptx, code.sm) == (("8.0", "9.0"), ("9.0",), ["sm_80", "sm_90"])
    assert code.runs_on("8.6") == "sm_80"  # same major, lower minor
    assert code.runs_on("10.0") == "compute_90 (PTX JIT)"
    assert code.runs_on("7.5") is None
    tool = cuobjdump()
    if tool:  # the toolkit's own reading agrees
        out = subprocess.run([tool, "--list-elf", "--list-ptx", str(so)], capture_output=True,
                             text=True, timeout=60).stdout
        listed = fatbin.parse_cuobjdump(out)
        assert (listed.elf, listed.ptx) == (code.elf, code.ptx)


@needs_nvcc
def test_reader_single_arch_without_ptx(tmp_path):
    code = fatbin.read_device_code(compile_so(tmp_path, "k", "arch=compute_90,code=sm_90"))
    assert (code.elf, code.ptx) == (("9.0",), ())
    assert code.runs_on("8.0") is None and code.runs_on("9.0") == "sm_90"


def test_reader_host_only_and_not_elf(tmp_path):
    code = fatbin.read_device_code("/bin/sh")
    assert (code.elf, code.ptx) == ((), ()) and "no .nv_fatbin" in code.notes[0]
    text = tmp_path / "x.so"
    text.write_text("not an object file at all, but long enough to be read" * 3)
    with pytest.raises(fatbin.FatbinError, match="is not an ELF file"):
        fatbin.read_device_code(text)
    with pytest.raises(fatbin.FatbinError, match="cannot read"):
        fatbin.read_device_code(tmp_path / "missing.so")


def test_compare_and_unable():
    code = fatbin.DeviceCode("op", ("8.0", "9.0"))
    assert fatbin.compare(code, ["8.0", "9.0"]) == ([], [])
    assert fatbin.compare(code, ["8.0"]) == ([], ["9.0"])
    assert fatbin.compare(code, ["7.0", "8.0", "9.0"]) == (["7.0"], [])
    record = {"fused_adam": {"elf": ["8.0", "9.0"], "ptx": []},
              "cpu_adam": {"elf": [], "ptx": []},
              "transformer": {"elf": ["9.0"], "ptx": ["9.0"]}}
    assert fatbin.unable(record, "7.0") == ["fused_adam", "transformer"]
    assert fatbin.unable(record, "8.6") == ["transformer"]  # no sm_8x SASS, PTX is 9.0
    assert fatbin.unable(record, "10.0") == ["fused_adam"]  # transformer: compute_90 JIT


# -- the recorded real builds ---------------------------------------------------------------
RECORDED = sorted(p.name for p in BUILDS.glob("*.cuobjdump.txt")) if BUILDS.is_dir() else []


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_listings_hold_exactly_the_requested_archs(name):
    first = (BUILDS / name).read_text().splitlines()[0]
    assert first.startswith("# source:") and "dsenv provision" in first
    requested = name.removesuffix(".cuobjdump.txt").removeprefix("arch-").split("_")
    ops = listing(name)
    assert {"fused_adam", "fused_lamb", "transformer"} <= set(ops)
    for op, code in ops.items():
        if code.elf or code.ptx:  # CPU ops (cpu_adam, ...) hold no device code
            assert fatbin.compare(code, requested) == ([], []), (op, code)


def test_recorded_manifest_archs_match_the_listings():
    manifests = sorted(BUILDS.glob("*.manifest-ops.json")) if BUILDS.is_dir() else []
    if not manifests:
        pytest.skip("no recorded manifest")
    for path in manifests:
        ops = json.loads("".join(line for line in path.read_text().splitlines(keepends=True)
                                 if not line.startswith("# source:")))
        stem = path.name.replace(".manifest-ops.json", "")
        code = listing(next(f"{stem}{suffix}" for suffix in (".cuobjdump.txt", ".listing.txt")
                            if (BUILDS / f"{stem}{suffix}").is_file()))
        assert ops["toolkit"]["source"] in ("node", "wheels")
        for op, record in ops["archs"].items():
            if record["elf"] or record["ptx"]:
                assert (tuple(record["elf"]), tuple(record["ptx"])) == (code[op].elf,
                                                                      code[op].ptx), op


# -- deepspeed.op-archs ---------------------------------------------------------------------
def gpu(name, arch, index=0):
    return Gpu("nvidia", index, name, arch, driver="580.65.06")


@pytest.fixture
def env_with_ops(tmp_path, make_ctx):
    """A provisioned env whose manifest records the device code of a recorded build."""

    def build(recorded: str | None, gpus=()):
        prefix = tmp_path / "env"
        prefix.mkdir(exist_ok=True)
        archs = {op: code.to_json() for op, code in listing(recorded).items()} if recorded \
            else {}
        manifest = {"schema": "dsenv.env/1", "env_dir": str(prefix), "kind": "venv",
                    "site": "generic", "stack": "cuda13.0", "torch": "torch==2.13.0",
                    "target": {"vendor": "nvidia", "archs": []}, "lock": {}, "packages": {},
                    "ops": {"mode": "auto", "requested": sorted(archs),
                            "installed": sorted(archs), "omitted": {}, "archs": archs},
                    "versions": {}, "command": [], "host": "h", "created": "2026-11-24"}
        (prefix / "dsenv-env.json").write_text(json.dumps(manifest))
        ctx = make_ctx(target="compute")
        ctx.memo(target_env.environment.memo_key, lambda: target_env.PythonEnv(
            None, prefix, "option", f"--env {prefix}"))
        ctx.memo(visible_gpus.memo_key, lambda: list(gpus))
        return ctx

    return build


def run_check(ctx):
    all_checks()
    return CHECKS["deepspeed.op-archs"].func(ctx)


needs_recorded = pytest.mark.skipif(not RECORDED, reason="no recorded CUDA build listing")


@needs_recorded
def test_doctor_fails_a_gpu_whose_arch_no_op_holds(env_with_ops):
    name = next((n for n in RECORDED if n.startswith("arch-8.0_9.0")), RECORDED[0])
    result = run_check(env_with_ops(name, [gpu("Tesla V100-SXM2-32GB", "7.0")]))
    assert result.status is Status.FAIL
    assert "no kernel image is available for execution on the device" in result.summary
    assert "fused_adam" in result.summary and "sm_70" in result.summary
    assert "--arch" in here(result) and "7.0" in here(result)
    assert any(e.startswith("fused_adam: sm_80, sm_90") for e in result.evidence)


@needs_recorded
def test_doctor_passes_the_gpus_the_ops_were_built_for(env_with_ops):
    name = next((n for n in RECORDED if n.startswith("arch-8.0_9.0")), RECORDED[0])
    result = run_check(env_with_ops(name, [gpu("NVIDIA A100-SXM4-80GB", "8.0"),
                                           gpu("NVIDIA H100 80GB HBM3", "9.0", 1)]))
    assert result.status is Status.OK, result.summary
    assert "A100" in result.summary and "H100" in result.summary
    # an A10 (sm_86) runs sm_80 SASS
    assert run_check(env_with_ops(name, [gpu("NVIDIA A10", "8.6")])).status is Status.OK


@pytest.mark.skipif("arch-8.0.cuobjdump.txt" not in RECORDED, reason="no sm_80-only listing")
def test_doctor_fails_an_h100_for_an_sm80_only_build(env_with_ops):
    failing = run_check(env_with_ops("arch-8.0.cuobjdump.txt", [gpu("NVIDIA H100", "9.0")]))
    healthy = run_check(env_with_ops("arch-8.0.cuobjdump.txt", [gpu("NVIDIA A100", "8.0")]))
    assert (failing.status, healthy.status) == (Status.FAIL, Status.OK)
    assert "sm_90" in failing.summary


@pytest.mark.skipif("arch-7.0.cuobjdump.txt" not in RECORDED, reason="no Volta listing")
def test_doctor_on_the_real_volta_build(env_with_ops):
    """The --arch 7.0 build (CUDA 12.4 nvcc, torch 2.10.0 cu128): a V100 and a T4 (sm_75
    runs sm_70 SASS) pass; an A100 fails, since sm_70 SASS does not run on another major and
    the build holds no PTX to JIT."""
    name = "arch-7.0.cuobjdump.txt"
    healthy = run_check(env_with_ops(name, [gpu("Tesla V100-SXM2-32GB", "7.0"),
                                            gpu("Tesla T4", "7.5", 1)]))
    failing = run_check(env_with_ops(name, [gpu("NVIDIA A100-SXM4-80GB", "8.0")]))
    assert (healthy.status, failing.status) == (Status.OK, Status.FAIL), failing.summary
    assert "sm_80" in failing.summary and "transformer" in failing.summary


@needs_recorded
def test_doctor_without_gpu_or_record(env_with_ops):
    assert run_check(env_with_ops(RECORDED[0], [])).status is Status.INFO
    assert run_check(env_with_ops(None, [gpu("NVIDIA A100", "8.0")])).status is Status.SKIP


def test_h100_run_agrees_with_the_reader():
    """Recorded on an H100: the sm_90 build ran (same result as torch's Adam), the sm_80
    build failed with "no kernel image", as the reading of each object predicts."""
    runs = [json.loads(line) for line in fixture_text("cuda-build/h100-fused_adam-run.jsonl")
            .splitlines() if line.strip()]
    smi = fixture_text("cuda-build/h100-nvidia-smi.txt")
    assert "NVIDIA H100 80GB HBM3" in smi and "Driver Version: 580.159.04" in smi
    assert len(runs) == 2
    for run in runs:
        arch = "9.0" if "build-9.0" in run["so"] else "8.0"
        code = listing(f"h100-fused_adam-{arch}.listing.txt")["fused_adam"]
        assert code.elf == (arch,)
        predicted = fatbin.unable({"fused_adam": code.to_json()}, "9.0")
        assert run["capability"] == [9, 0]
        assert run["ok"] is (not predicted), run
        if predicted:
            assert "no kernel image is available for execution on the device" in run["error"]
        else:
            assert run["max_abs_diff_vs_torch_adam"] < 1e-6
